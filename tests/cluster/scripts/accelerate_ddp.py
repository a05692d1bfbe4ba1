"""A plain Accelerate training script (nothing in it knows about the workbench): the same
file runs in one process or under a launcher. Rank 0 writes the global loss of every step
to --out as JSON."""

import argparse
import json

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8, help="global batch size")
parser.add_argument("--out", required=True)
args = parser.parse_args()

accelerator = Accelerator()
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(64, 6, generator=generator)
targets = inputs @ torch.randn(6, 1, generator=generator)
dataset = TensorDataset(inputs, targets)
loader = DataLoader(dataset, batch_size=args.batch // accelerator.num_processes)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

losses = []
for x, y in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    losses.append(accelerator.gather(loss.detach()[None]).mean().item())

if accelerator.is_main_process:
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "processes": accelerator.num_processes}, f)
    print(f"{accelerator.distributed_type}: {len(losses)} steps on {accelerator.num_processes}")
accelerator.end_training()
