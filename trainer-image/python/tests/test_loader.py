"""The user's own DataLoader, real processes: 3 Gloo ranks with
``DataLoader(num_workers=2)`` on ``ht.batch_sampler()``, plain DDP and
``ht.scale(loss)``, re-split from (20, 9, 3) to (4, 12, 16) across an epoch
boundary, equal one plain process with B = 32; and the same run stopped
at a checkpoint and resumed by new processes."""

import json
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import HERE, launch_ranks, max_param_diff, read, wait_all  # noqa: E402

WORKER = os.path.join(HERE, "loader_worker.py")
REFERENCE = os.path.join(HERE, "ddp_worker.py")
WORLD, WORKERS = 3, 2
N, B, STEPS, SEED = 160, 32, 14, 11  # 5 steps per epoch: epoch ends after 5 and 10
# Lookahead: 2 workers x prefetch_factor 2 + 1. Rank 0 writes the new plan
# after step 2; step 3 agrees it; it is in force from step 3 + 5 = 8, and
# steps 8..14 cross the epoch end after step 10.
LOOKAHEAD = WORKERS * 2 + 1
SWITCH = 3 + LOOKAHEAD
OLD, NEW = [20, 9, 3], [4, 12, 16]


def plan(gen, sizes):
    return json.dumps({"generation": gen, "globalBatchSize": sum(sizes), "batchSizes": sizes,
                       "policy": "test", "reason": f"generation {gen}"})


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def run(out, plan_text, worker=WORKER, env=None, **cfg):
    """One job of WORLD ranks and the one-process reference beside it."""
    plan_file = os.path.join(out, "plan.json")
    with open(plan_file, "w") as f:
        f.write(plan_text)
    common = {"n": N, "b": B, "steps": STEPS, "seed": SEED, "out": out}
    job = write(os.path.join(out, "job.cfg"), dict(common, plan_file=plan_file, workers=WORKERS, **cfg))
    procs = launch_ranks([worker, job], WORLD, out, **(env or {}))
    ref_dir = os.path.join(out, "ref")
    os.makedirs(ref_dir, exist_ok=True)
    ref = write(os.path.join(out, "ref.cfg"), dict(common, mode="reference"))
    procs += launch_ranks([REFERENCE, ref], 1, ref_dir)
    codes = wait_all(procs, timeout=300)
    logs = {}
    for r in range(WORLD):
        p = os.path.join(out, f"rank{r}.json")
        if os.path.exists(p):
            with open(p) as f:
                logs[r] = json.load(f)
    consoles = [read(os.path.join(out, f"rank{r}.log")) for r in range(WORLD)]
    return codes, logs, consoles



class OwnDataLoaderTest(unittest.TestCase):
    def check_steps(self, out, logs, steps, lookahead=LOOKAHEAD):
        """Every rank trained ``steps`` in order, on the old plan until 3 +
        lookahead and the new one from there, each batch the plan's slice
        of the one-process batch."""
        with open(os.path.join(out, "reference.json")) as f:
            ref = json.load(f)
        for r in range(WORLD):
            self.assertEqual([e["step"] for e in logs[r]["log"]], list(steps), f"rank {r}")
        for i, step in enumerate(steps):
            sizes = OLD if step < 3 + lookahead else NEW
            union = []
            for r in range(WORLD):
                e = logs[r]["log"][i]
                self.assertEqual(e["sizes"], sizes, f"rank {r} step {step}")
                self.assertEqual(e["lookahead"], lookahead)
                self.assertEqual(e["rows"], sizes[r], f"rank {r} step {step}: the batch the loader fetched")
                union += e["indices"]
            self.assertEqual(union, ref[step - 1], f"step {step}: the ranks' slices are the one-process batch")

    def check_framework(self, worker, what, lookahead=LOOKAHEAD, env=None, global_step=False):
        """``worker``'s ranks re-split from OLD to NEW across an epoch end
        equal one process with B within 1e-5; with ``global_step`` the
        framework's own step count is the run's."""
        with tempfile.TemporaryDirectory(prefix="ht-framework-") as out:
            codes, logs, consoles = run(out, plan(1, OLD), worker=worker, env=env,
                                        writes={"2": plan(2, NEW)})
            self.assertEqual(codes, [0] * (WORLD + 1), "\n".join(c[-3000:] for c in consoles))
            self.check_steps(out, logs, range(1, STEPS + 1), lookahead=lookahead)
            if global_step:
                for r in range(WORLD):
                    self.assertEqual(logs[r]["global_step"], STEPS, f"{what} ran heterotrain's steps")
            diff = max_param_diff(out)
            print(f"\n  {what}: max param diff = {diff:.3e}", file=sys.stderr)
            self.assertLess(diff, 1e-5)

    def test_workers_and_a_resplit_across_an_epoch_equal_one_process(self):
        with tempfile.TemporaryDirectory(prefix="ht-loader-") as out:
            codes, logs, consoles = run(out, plan(1, OLD), writes={"2": plan(2, NEW)})
            self.assertEqual(codes, [0] * (WORLD + 1), "\n".join(c[-2000:] for c in consoles))
            self.check_steps(out, logs, range(1, STEPS + 1))
            self.assertIn(f"plan generation 1 -> 2 {NEW} from step {SWITCH}", consoles[0])
            diff = max_param_diff(out)
            print(f"\n  DataLoader(num_workers={WORKERS}) + scale(): max param diff = {diff:.3e}", file=sys.stderr)
            self.assertLess(diff, 1e-5)

    def test_resume_from_a_checkpoint_continues_the_same_run(self):
        stop = 9  # mid-epoch (epoch 2 is steps 6..10), after the switch
        with tempfile.TemporaryDirectory(prefix="ht-resume-") as out:
            ckpt = os.path.join(out, "ckpt.pt")
            first = os.path.join(out, "first")
            os.makedirs(first)
            codes, logs, consoles = run(first, plan(1, OLD), writes={"2": plan(2, NEW)},
                                        stop_after=stop, checkpoint=ckpt)
            self.assertEqual(codes, [0] * (WORLD + 1), "\n".join(c[-2000:] for c in consoles))
            self.assertEqual(logs[0]["step"], stop)
            state = torch.load(ckpt)["heterotrain"]
            self.assertEqual((state["step"], state["plan"]["generation"]), (stop, 2))
            # New processes; the plan source still says generation 2, as the
            # operator's ConfigMap would.
            codes, logs, consoles = run(out, plan(2, NEW), resume=ckpt)
            self.assertEqual(codes, [0] * (WORLD + 1), "\n".join(c[-2000:] for c in consoles))
            self.check_steps(out, logs, range(stop + 1, STEPS + 1))
            diff = max_param_diff(out)
            print(f"\n  stopped after step {stop}, resumed: max param diff = {diff:.3e}", file=sys.stderr)
            self.assertLess(diff, 1e-5)


if __name__ == "__main__":
    unittest.main()
