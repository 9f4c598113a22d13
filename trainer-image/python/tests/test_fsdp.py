"""FSDP2 (``fully_shard``) on CPU, real processes: 3 Gloo ranks with the
script's own ``DataLoader(num_workers=2)`` and ``ht.scale(loss)``,
re-split from (20, 9, 3) to (4, 12, 16) across an epoch end, equal one
plain process with B = 32."""

import os
import sys
import tempfile
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
        with tempfile.TemporaryDirectory(prefix="ht-fsdp-") as out:
            codes, logs, consoles = tl.run(out, tl.plan(1, tl.OLD), worker=WORKER,
                                             writes={"2": tl.plan(2, tl.NEW)})
            self.assertEqual(codes, [0] * (tl.WORLD + 1), "\n".join(c[-3000:] for c in consoles))
            self.check_steps(out, logs, range(1, tl.STEPS + 1))
            diff = tl.max_param_diff(out)
            print(f"\n  FSDP2 fully_shard + DataLoader(num_workers={tl.WORKERS}): max param diff = {diff:.3e}",
                  file=sys.stderr)
            self.assertLess(diff, 1e-5)


if __name__ == "__main__":
    unittest.main()
