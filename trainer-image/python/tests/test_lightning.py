"""PyTorch Lightning, real processes: 3 Gloo ranks, each a
``lightning.Trainer(**heterotrain.lightning.trainer_kwargs(ht))`` with the
script's own ``DataLoader(num_workers=2)`` on ``ht.batch_sampler()``,
re-split from (20, 9, 3) to (4, 12, 16) and across an epoch end, equal one
plain process with B = 32."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HERE  # noqa: E402
import test_loader as tl  # noqa: E402  (a module: discover does not run its tests twice)

WORKER = os.path.join(HERE, "lightning_worker.py")
# Lightning iterates the loader before any hook could read its prefetch
# depth, so the sampler's default lookahead (9) holds; it covers Lightning's
# one batch ahead plus 2 workers x prefetch_factor 2 (the callback refuses
# a loader that would need more).
LOOKAHEAD = 9


class LightningTest(tl.OwnDataLoaderTest):
    # Only the Lightning case here (the loader's own cases run in test_loader).
    test_workers_and_a_resplit_across_an_epoch_equal_one_process = None
    test_resume_from_a_checkpoint_continues_the_same_run = None

    def test_lightning_trainer_equals_one_process(self):
        try:
            import lightning  # noqa: F401
        except ImportError:
            self.fail("PyTorch Lightning is not installed in this Python: run `make setup`")
        self.check_framework(WORKER, f"Lightning + DataLoader(num_workers={tl.WORKERS})", lookahead=LOOKAHEAD,
                             env={"LOCAL_WORLD_SIZE": tl.WORLD, "GROUP_RANK": 0}, global_step=True)

if __name__ == "__main__":
    unittest.main()
