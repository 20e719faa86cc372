"""Tests run single-threaded: the machine is shared and tiny models gain nothing from threads."""

import torch

torch.set_num_threads(1)
