"""FSDP2 (``fully_shard``) on CPU, real processes: 3 Gloo ranks with the
script's own ``DataLoader(num_workers=2)`` and ``ht.scale(loss)``,
re-split from (20, 9, 3) to (4, 12, 16) across an epoch end, equal one
plain process with B = 32."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HERE  # noqa: E402
import test_loader as tl  # noqa: E402  (a module: discover does not run its tests twice)

WORKER = os.path.join(HERE, "fsdp_worker.py")


class FSDPTest(tl.OwnDataLoaderTest):
    # Only the FSDP case here (the loader's own cases run in test_loader).
    test_workers_and_a_resplit_across_an_epoch_equal_one_process = None
    test_resume_from_a_checkpoint_continues_the_same_run = None

    def test_fully_shard_equals_one_process(self):
        self.check_framework(WORKER, f"FSDP2 fully_shard + DataLoader(num_workers={tl.WORKERS})")

if __name__ == "__main__":
    unittest.main()
