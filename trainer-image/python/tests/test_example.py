"""examples/own-model/train.py as 2 real Gloo ranks: SIGTERM to one rank
stops both at the same step, and both exit 0."""

import os
import re
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO_ROOT, launch_ranks, read, wait_all  # noqa: E402

EXAMPLE = os.path.join(REPO_ROOT, "examples", "own-model", "train.py")


class ExampleSigtermTest(unittest.TestCase):
    def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(self):
        with tempfile.TemporaryDirectory(prefix="ht-example-") as out:
            plan = os.path.join(out, "plan.json")
            with open(plan, "w") as f:
                f.write('{"generation":1,"globalBatchSize":48,"batchSizes":[40,8],"policy":"test","reason":"r"}')
            procs = launch_ranks([EXAMPLE, "--steps", "100000", "--batch-size", "48", "--samples", "960",
                                  "--log-every", "5", "--plan-file", plan],
                                 2, out, HT_METRICS_PORT=0)
            log0 = os.path.join(out, "rank0.log")
            deadline = time.time() + 90
            while time.time() < deadline and "step 10/" not in read(log0):
                if any(p.poll() is not None for p, _ in procs):
                    break
                time.sleep(0.2)
            self.assertIn("step 10/", read(log0), "the example did not get going")
            procs[1][0].send_signal(signal.SIGTERM)
            codes = wait_all(procs, timeout=60)
            logs = [read(os.path.join(out, f"rank{r}.log")) for r in range(2)]
            self.assertEqual(codes, [0, 0], "\n".join(x[-2000:] for x in logs))
            self.assertIn("plan 1 [40, 8]", logs[0])
            stops = [re.search(r"rank \d: stopped \(SIGTERM\) after step (\d+)", x) for x in logs]
            self.assertTrue(all(stops), "\n".join(x[-2000:] for x in logs))
            self.assertEqual(stops[0].group(1), stops[1].group(1))
            self.assertGreaterEqual(int(stops[0].group(1)), 10)


if __name__ == "__main__":
    unittest.main()
