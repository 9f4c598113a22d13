"""The Hugging Face Trainer, real processes: 3 Gloo ranks, each a
``heterotrain.hf.HeteroTrainer`` with ``dataloader_num_workers=2``,
re-split from (20, 9, 3) to (4, 12, 16) and across an epoch end, equal one
plain process with B = 32."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HERE  # noqa: E402
import test_loader as tl  # noqa: E402  (a module: discover does not run its tests twice)

WORKER = os.path.join(HERE, "hf_worker.py")
# The Trainer fetches one batch ahead of the loader's 2 workers x
# prefetch_factor 2; the callback sets the lookahead before the first fetch.
LOOKAHEAD = tl.WORKERS * 2 + 2


class HuggingFaceTest(tl.OwnDataLoaderTest):
    # Only the Trainer's case here (the loader's own cases run in test_loader).
    test_workers_and_a_resplit_across_an_epoch_equal_one_process = None
    test_resume_from_a_checkpoint_continues_the_same_run = None

    def test_hf_trainer_equals_one_process(self):
        try:
            import transformers  # noqa: F401
            import accelerate  # noqa: F401
        except ImportError:
            self.fail("transformers and accelerate are not installed in this Python: run `make setup`")
        self.check_framework(WORKER, f"HF Trainer + dataloader_num_workers={tl.WORKERS}", lookahead=LOOKAHEAD,
                             env={"LOCAL_WORLD_SIZE": tl.WORLD, "GROUP_RANK": 0}, global_step=True)

if __name__ == "__main__":
    unittest.main()
