"""examples/own-model/train.py as 2 real Gloo ranks with their own
DataLoader: SIGTERM to one rank stops both at the same step, and both exit
0; a rank SIGKILLed mid-run, the gang started again continues from the
newest checkpoint's step to the end."""

import os
import re
import signal
import sys
import tempfile
import time
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO_ROOT, launch_ranks, read, wait_all  # noqa: E402

EXAMPLE = os.path.join(REPO_ROOT, "examples", "own-model", "train.py")


def wait_for_text(path, text, procs, seconds):
    """The log at ``path`` once it holds ``text``, a process ended, or
    ``seconds`` passed (a generous bound: it ends a hung run, never measures)."""
    deadline = time.time() + seconds
    while time.time() < deadline and text not in read(path):
        if any(p.poll() is not None for p, _ in procs):
            break
        time.sleep(0.2)
    return read(path)


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
            self.assertIn("step 10/", wait_for_text(log0, "step 10/", procs, 90), "the example did not get going")
            procs[1][0].send_signal(signal.SIGTERM)
            codes = wait_all(procs, timeout=60)
            logs = [read(os.path.join(out, f"rank{r}.log")) for r in range(2)]
            self.assertEqual(codes, [0, 0], "\n".join(x[-2000:] for x in logs))
            self.assertIn("plan 1 [40, 8]", logs[0])
            stops = [re.search(r"rank \d: stopped \(SIGTERM\) after step (\d+)", x) for x in logs]
            self.assertTrue(all(stops), "\n".join(x[-2000:] for x in logs))
            self.assertEqual(stops[0].group(1), stops[1].group(1))
            self.assertGreaterEqual(int(stops[0].group(1)), 10)


    def test_a_killed_gang_resumes_from_its_checkpoint(self):
        with tempfile.TemporaryDirectory(prefix="ht-example-ckpt-") as out:
            ckpt_dir = os.path.join(out, "ckpt")
            argv = [EXAMPLE, "--steps", "60", "--batch-size", "48", "--samples", "960", "--log-every", "1",
                    "--checkpoint-dir", ckpt_dir, "--checkpoint-every", "10"]
            first = os.path.join(out, "first")
            os.makedirs(first)
            procs = launch_ranks(argv, 2, first, HT_METRICS_PORT=0)
            log0 = os.path.join(first, "rank0.log")
            self.assertIn("step 25/", wait_for_text(log0, "step 25/", procs, 120), "the example did not get going")
            procs[1][0].kill()
            for p, _ in procs:
                p.kill()
            wait_all(procs, timeout=60)
            saved = torch.load(os.path.join(ckpt_dir, "latest.pt"))["heterotrain"]["step"]
            self.assertGreaterEqual(saved, 20)
            self.assertEqual(saved % 10, 0)
            procs = launch_ranks(argv, 2, out, HT_METRICS_PORT=0)
            codes = wait_all(procs, timeout=180)
            logs = [read(os.path.join(out, f"rank{r}.log")) for r in range(2)]
            self.assertEqual(codes, [0, 0], "\n".join(x[-2000:] for x in logs))
            for r in range(2):
                self.assertIn(f"rank {r}: resumed from {ckpt_dir}/latest.pt after step {saved}", logs[r])
            steps = [int(m) for m in re.findall(r"^step (\d+)/60", logs[0], re.M)]
            self.assertEqual(steps, list(range(saved + 1, 61)), "the second run trains the steps after the checkpoint")
            self.assertEqual(torch.load(os.path.join(ckpt_dir, "latest.pt"))["heterotrain"]["step"], 60)


if __name__ == "__main__":
    unittest.main()
