"""The seed's migration example made runnable: init_process_group, DistributedSampler,
DistributedDataParallel on a tiny model. Written for torchrun; it is not changed to run
on the workbench. Rank 0 writes the global loss of every step to --out as JSON."""

import argparse
import json

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8, help="global batch size")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--out", required=True)
args = parser.parse_args()

# 1. the process group
torch.distributed.init_process_group(backend="gloo")
world = dist.get_world_size()

# 2. a distributed sampler: every rank a different part of the data
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(64, 6, generator=generator)
targets = inputs @ torch.randn(6, 1, generator=generator) + 0.1 * torch.randn(
    64, 1, generator=generator
)
dataset = TensorDataset(inputs, targets)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
dataloader = DataLoader(dataset, batch_size=args.batch // world, sampler=sampler)

# 3. the model wrapped for data parallelism
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

losses = []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in dataloader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)

if dist.get_rank() == 0:
    with open(args.out, "w") as f:
        json.dump(losses, f)
    print(f"{len(losses)} steps, last loss {losses[-1]:.6f}")
dist.destroy_process_group()
