"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: load a causal LM split over 2 tensor-parallel
ranks, write its logits on fixed inputs (logits.npy) and save it (rank 0 writes the whole HF checkpoint).

    tp_logits.py <model dir> <output dir>
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from alignment.models import LlamaForCausalLM  # noqa: E402
from alignment.parallel.layout import Layout  # noqa: E402
from alignment.parallel.distributed import init_distributed, is_main_process  # noqa: E402

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed(Layout(world=2, tensor=2))
model = LlamaForCausalLM.from_pretrained(model_dir)
assert model.config.tensor_parallel_degree == 2
ids = paddle.to_tensor([[5, 17, 300, 9, 44, 2], [3, 3, 12, 700, 81, 6]])
mask = paddle.to_tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
logits = model(ids, attention_mask=mask).logits
model.save_pretrained(os.path.join(out, "model"), tokenizer_dir=model_dir)
if is_main_process():
    np.save(os.path.join(out, "logits.npy"), logits.numpy())
    np.save(os.path.join(out, "q_proj_slice.npy"), model.model.layers[0].self_attn.q_proj.weight.numpy())
