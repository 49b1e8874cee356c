import torch.distributed as dist
dist.init_process_group("gloo"); print("ok", dist.get_rank()); dist.destroy_process_group()
