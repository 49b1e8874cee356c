#!/usr/bin/env python3
"""The article's demo.py, ported to current PyTorch: Linear(5 -> 2) on 90 random samples,
batch 30, DistributedDataParallel over NCCL (gloo when there is no GPU), printing what each
rank sees. Runs unchanged under torchrun and under mgpu-launch:

    mgpu-launch --nproc_per_node=1 scripts/demo.py
    mgpu-launch --nproc_per_node=2 --legacy_local_rank scripts/demo.py   # --local_rank=N form

The port reads LOCAL_RANK from the environment (torchrun's way) and still accepts the
article's --local_rank / --local-rank argument (torch.distributed.launch's way).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

input_size, output_size = 5, 2
batch_size, data_size = 30, 90


class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


class Model(nn.Module):
    def __init__(self, input_size, output_size):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, input):
        output = self.fc(input)
        print("\tIn Model: input size", list(input.size()), "output size", list(output.size()))
        return output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", "--local-rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)))
    args = parser.parse_args()
    local_rank = args.local_rank
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    print("local_rank", local_rank)
    dataset = RandomDataset(input_size, data_size)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))
    model = Model(input_size, output_size).to(device)
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    model = DDP(model, device_ids=[local_rank] if cuda else None)
    for data in loader:
        input = data.to(device)
        output = model(input)
        print("Outside: input size", list(input.size()), "output_size", list(output.size()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
