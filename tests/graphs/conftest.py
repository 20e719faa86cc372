import torch

torch.set_num_threads(1)
