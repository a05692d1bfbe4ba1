"""A plain Hugging Face Trainer script: a tiny GPT-2 built from a config (nothing is
downloaded), dropout off. Rank 0 writes the loss of every logged step to --out as JSON."""

import argparse
import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8, help="global batch size")
parser.add_argument("--out", required=True)
args = parser.parse_args()
world = int(os.environ.get("WORLD_SIZE", "1"))


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (32, 12), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


config = GPT2Config(
    vocab_size=64,
    n_positions=16,
    n_embd=16,
    n_layer=1,
    n_head=2,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)
torch.manual_seed(0)
model = GPT2LMHeadModel(config)
training = TrainingArguments(
    output_dir=os.path.join(os.path.dirname(args.out), "trainer_out"),
    per_device_train_batch_size=args.batch // world,
    num_train_epochs=1,
    learning_rate=1e-2,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    seed=0,
    disable_tqdm=True,
)
trainer = Trainer(model=model, args=training, train_dataset=Tokens())
trainer.train()
if trainer.is_world_process_zero():
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "processes": training.world_size}, f)
    print(f"{len(losses)} steps on {training.world_size}")
