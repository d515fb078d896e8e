"""Save or restore a state with DTensors under torchrun; used by tests/integration/test_dtensor.py.

dtensor_ckpt.py save ROOT      # 8x2 arange sharded over the ranks, plus a replicated tensor
dtensor_ckpt.py restore ROOT   # restore into zeros laid out for this world size; check values
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from preemptible import Checkpointer
from preemptible.distributed import forget_process_groups, init_process_group

mode, root = sys.argv[1], sys.argv[2]
init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
full = torch.arange(16.0).reshape(8, 2)
ckpt = Checkpointer(root)
if mode == "save":
    state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "plain": torch.ones(3)}
    ckpt.save(1, state)
else:
    w = distribute_tensor(torch.zeros(8, 2), mesh, [Shard(0)])
    state = {"w": w, "plain": torch.zeros(3)}
    assert ckpt.restore(state) == 1
    assert state["w"] is w and torch.equal(w.full_tensor(), full), w.full_tensor()
    assert torch.equal(state["plain"], torch.ones(3))
    local = w.to_local()
    rows = 8 // dist.get_world_size()
    assert torch.equal(local, full[dist.get_rank() * rows : (dist.get_rank() + 1) * rows])
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} restored its shard", flush=True)
# Leave together: a rank tearing down gloo while its peer still talks has aborted once in CI.
dist.barrier()
forget_process_groups()
dist.destroy_process_group()
