"""Real torch.distributed: 3 Gloo processes with uneven, changing local
batches vs one plain PyTorch process with the global batch B = 32."""

import json
import os
import re
import sys
import tempfile
import unittest


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import HERE, launch_ranks, max_param_diff, promtool, promtool_check, read, wait_all  # noqa: E402

WORKER = os.path.join(HERE, "ddp_worker.py")
WORLD = 3
N, B, STEPS, SEED = 100, 32, 12, 5  # 3 steps per epoch: epochs at steps 1, 4, 7, 10


def plan(gen, sizes):
    return json.dumps({"generation": gen, "globalBatchSize": sum(sizes), "batchSizes": sizes,
                       "policy": "test", "reason": f"generation {gen}"})


# What rank 0 writes into the plan file after each step (an operator's role).
WRITES = {
    "2": plan(2, [28, 3, 1]),                # in force from step 3: steps 3..7 cross two epoch ends
    "4": "{\"generation\": 9, \"globalBa",   # malformed: ignored, training goes on under gen 2
    "5": plan(1, [20, 9, 3]),                # old generation: refused
    "6": plan(3, [16, 8, 4, 4]),             # wrong length: refused
    "7": plan(4, [24, 0, 8]),                # in force from step 8: rank 1 left out (skips 8, 9)
    "9": plan(5, [4, 12, 16]),               # from step 10, an epoch's start: rank 1 trains again
}
EXPECTED_GEN = {1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 4, 9: 4, 10: 5, 11: 5, 12: 5}
SIZES = {1: [20, 9, 3], 2: [28, 3, 1], 4: [24, 0, 8], 5: [4, 12, 16]}
LEFT_OUT = {1: {8, 9}}  # rank: the steps it skips


def run_job(out, hook=True):
    plan_file = os.path.join(out, "plan.json")
    with open(plan_file, "w") as f:
        f.write(plan(1, [20, 9, 3]))
    common = {"n": N, "b": B, "steps": STEPS, "seed": SEED, "out": out}
    hetero = dict(common, mode="hetero", plan_file=plan_file, writes=WRITES, hook=hook)
    ref = dict(common, mode="reference")
    paths = []
    for name, cfg in (("hetero", hetero), ("reference", ref)):
        paths.append(os.path.join(out, f"{name}.json.cfg"))
        with open(paths[-1], "w") as f:
            json.dump(cfg, f)
    procs = launch_ranks([WORKER, paths[0]], WORLD, out)
    # The reference runs beside the job (one more process).
    ref_dir = os.path.join(out, "ref")
    os.makedirs(ref_dir, exist_ok=True)
    procs += launch_ranks([WORKER, paths[1]], 1, ref_dir)
    return wait_all(procs)



class HeteroDDPTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="ht-ddp-")
        cls.out = cls._tmp.name
        cls.codes = run_job(cls.out)
        cls.logs = {}
        for r in range(WORLD):
            p = os.path.join(cls.out, f"rank{r}.json")
            if os.path.exists(p):
                with open(p) as f:
                    cls.logs[r] = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def console(self, rank):
        return read(os.path.join(self.out, f"rank{rank}.log"))

    def test_0_processes_exit_cleanly(self):
        for r, c in enumerate(self.codes):
            name = f"rank {r}" if r < WORLD else "reference"
            log = self.console(r) if r < WORLD else read(os.path.join(self.out, "ref", "rank0.log"))
            self.assertEqual(c, 0, f"{name} exited {c}:\n{log[-3000:]}")
        self.assertEqual(sorted(self.logs), list(range(WORLD)))

    def test_parameters_match_one_process_with_b32(self):
        diff = max_param_diff(self.out)
        print(f"\n  max |param(3 ranks, uneven, re-split) - param(1 process, B=32)| = {diff:.3e}",
              file=sys.stderr)
        self.assertLess(diff, 1e-5)

    def test_all_ranks_switch_at_the_same_step(self):
        seen = {r: [(e["step"], e["generation"], e["sizes"]) for e in self.logs[r]["log"]] for r in range(WORLD)}
        self.assertEqual(seen[0], seen[2])
        self.assertEqual(seen[1], [e for e in seen[0] if e[0] not in LEFT_OUT[1]])
        self.assertEqual([s for s, _, _ in seen[0]], list(range(1, STEPS + 1)))
        for step, gen, sizes in seen[0]:
            self.assertEqual(gen, EXPECTED_GEN[step], f"step {step}")
            self.assertEqual(sizes, SIZES[gen], f"step {step}")

    def test_slices_are_the_one_process_batch(self):
        with open(os.path.join(self.out, "reference.json")) as f:
            ref = json.load(f)
        by_step = {r: {e["step"]: e for e in self.logs[r]["log"]} for r in range(WORLD)}
        for i in range(STEPS):
            entries = [by_step[r].get(i + 1) for r in range(WORLD)]
            union = [j for e in entries if e is not None for j in e["indices"]]
            self.assertEqual(union, ref[i], f"step {i + 1}")
            for r, e in enumerate(entries):
                if e is not None:
                    self.assertEqual(len(e["indices"]), e["sizes"][r])
                    self.assertEqual(e["rows"], e["sizes"][r])
        self.assertEqual([e["epoch"] for e in self.logs[0]["log"]], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])

    def test_a_left_out_rank_spends_no_forward_and_no_gradient_bytes(self):
        for r in range(WORLD):
            skipped = LEFT_OUT.get(r, set())
            log = self.logs[r]
            trained = [s for s in range(1, STEPS + 1) if s not in skipped]
            self.assertEqual(log["forwards"], trained, f"rank {r}: one forward per step it trains")
            self.assertEqual(log["skipped"], len(skipped))
            # DDP's buckets hold every parameter's gradient once a step.
            self.assertEqual(log["gradient_bytes"], len(trained) * log["parameter_bytes"], f"rank {r}")
        self.assertIn("ranks [1] train again: model and optimizer state copied from rank 0", self.console(0))

    def test_bad_plans_are_refused_with_warning_and_counted(self):
        log0 = self.console(0)
        self.assertIn("ignoring proposed plan, keeping generation 2: plan is not valid JSON", log0)
        self.assertIn("generation 1 is not newer than the current 2", log0)
        self.assertIn("plan has 4 batch sizes but WORLD_SIZE is 3", log0)
        m = read(os.path.join(self.out, "metrics0.txt"))
        self.assertRegex(m, r'heterotrain_plan_rejected_total\{reason="parse"\} 1\.0')
        self.assertRegex(m, r'heterotrain_plan_rejected_total\{reason="old_generation"\} 1\.0')
        self.assertRegex(m, r'heterotrain_plan_rejected_total\{reason="wrong_length"\} 1\.0')
        for r in range(WORLD):
            self.assertEqual(self.logs[r]["step"], STEPS, "training went on to the last step")

    def test_metrics_after_the_run(self):
        def value(text, name):
            mm = re.search(rf"^{name} (\S+)$", text, re.M)
            self.assertIsNotNone(mm, f"{name} missing")
            return float(mm.group(1))

        expected_samples = {0: 2 * 20 + 5 * 28 + 2 * 24 + 3 * 4, 1: 2 * 9 + 5 * 3 + 0 + 3 * 12,
                            2: 2 * 3 + 5 * 1 + 2 * 8 + 3 * 16}
        for r in range(WORLD):
            m = read(os.path.join(self.out, f"metrics{r}.txt"))
            self.assertEqual(value(m, "heterotrain_samples_total"), expected_samples[r])
            self.assertEqual(value(m, "heterotrain_steps_total"), STEPS)
            self.assertEqual(value(m, "heterotrain_step"), STEPS)
            self.assertEqual(value(m, "heterotrain_total_steps"), STEPS)
            self.assertEqual(value(m, "heterotrain_epoch"), 3)
            self.assertEqual(value(m, "heterotrain_plan_generation"), 5)
            self.assertEqual(value(m, "heterotrain_local_batch_size"), [4, 12, 16][r])
            self.assertEqual(value(m, "heterotrain_finished"), 1)
            self.assertGreater(value(m, "heterotrain_compute_seconds_total"), 0)
            for phase in ("data", "forward", "backward", "allreduce", "optimizer"):
                self.assertIn(f'heterotrain_phase_seconds_total{{phase="{phase}"}}', m)
            self.assertIn("# TYPE heterotrain_phase_seconds_total counter", m)
            self.assertNotIn("_created", m)

    def test_promtool_accepts_live_metrics(self):
        self.assertIsNotNone(promtool(), "promtool not found (on PATH or under $HETEROTRAIN_CACHE): run `make setup`")
        for r in range(WORLD):
            code, out = promtool_check(read(os.path.join(self.out, f"metrics{r}.txt")))
            self.assertEqual(code, 0, f"rank {r}: promtool check metrics:\n{out}")


class DefaultAveragingFailsTest(unittest.TestCase):
    """The equivalence check can fail: DDP's own hook (averaging over ranks)
    is wrong for uneven splits, and the same comparison catches it."""

    def test_without_the_hook_parameters_differ(self):
        with tempfile.TemporaryDirectory(prefix="ht-ddp-nohook-") as out:
            codes = run_job(out, hook=False)
            self.assertEqual(codes, [0] * (WORLD + 1), read(os.path.join(out, "rank0.log"))[-3000:])
            diff = max_param_diff(out)
            print(f"\n  without the hook: max param diff = {diff:.3e}", file=sys.stderr)
            self.assertGreater(diff, 1e-3)


if __name__ == "__main__":
    unittest.main()
