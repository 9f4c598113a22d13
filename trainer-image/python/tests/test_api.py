"""The library's rules on one rank (a one-process Gloo group): the
lookahead horizon, loss scaling, resume state, refused datasets."""

import os
import sys
import tempfile
import unittest
from unittest import mock

import torch
import torch.distributed as dist

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import PKG_ROOT  # noqa: E402

sys.path.insert(0, PKG_ROOT)
import heterotrain  # noqa: E402

_tmp = None


def setUpModule():
    global _tmp
    if not dist.is_initialized():
        _tmp = tempfile.TemporaryDirectory(prefix="ht-api-")
        dist.init_process_group("gloo", init_method=f"file://{_tmp.name}/store", rank=0, world_size=1)


def tearDownModule():
    if _tmp is not None:
        dist.destroy_process_group()
        _tmp.cleanup()


def make(**kw):
    args = dict(dataset_size=64, seed=3, serve_metrics=False, handle_sigterm=False)
    args.update(kw)
    return heterotrain.init(32, **args)


class LookaheadTest(unittest.TestCase):
    def test_indices_beyond_the_agreed_steps_are_refused(self):
        ht = make(dataset_size=128)
        it = iter(ht.batch_sampler(128, lookahead=2))
        self.assertEqual(len(next(it)), 32)  # step 1
        self.assertEqual(len(next(it)), 32)  # step 2: agreed at the start with lookahead 2
        with self.assertRaisesRegex(RuntimeError, r"indices of step 3 were asked for before its plan was agreed"):
            next(it)
        self.assertEqual(ht.lookahead, 2)

    def test_each_step_agrees_the_plan_lookahead_steps_ahead(self):
        ht = make(total_steps=6)
        sampler = ht.batch_sampler(64, lookahead=2)
        self.assertEqual(len(sampler), 2, "an epoch of 64 samples at B = 32 has 2 steps")
        it = iter(sampler)
        got = [next(it), next(it)]
        self.assertEqual(ht.begin_step(), 1)
        self.assertEqual(ht._horizon, 3)
        self.assertEqual(got[0] + got[1], ht.sampler.global_indices(1) + ht.sampler.global_indices(2))

    def test_lookahead_cannot_grow_after_the_start(self):
        ht = make()
        ht.batch_sampler(64, lookahead=1)
        ht.begin_step()
        with self.assertRaisesRegex(RuntimeError, "after the run started"):
            ht._set_lookahead(5)
        with self.assertRaisesRegex(ValueError, "lookahead must be an integer >= 1"):
            make().batch_sampler(64, lookahead=0)


class ScaleTest(unittest.TestCase):
    def test_scale_is_world_times_local_over_global(self):
        ht = make()
        ht.begin_step()
        self.assertEqual(ht.loss_weight, 1.0)  # one rank holds the whole batch
        self.assertEqual(float(ht.scale(torch.tensor(2.0))), 2.0)

    def test_scale_refuses_the_hook_and_outside_a_step(self):
        ht = make()
        with self.assertRaisesRegex(RuntimeError, "outside a step"):
            ht.scale(torch.tensor(1.0))
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        ht.attach(ddp)
        ht.begin_step()
        with self.assertRaisesRegex(RuntimeError, "use one or the other"):
            ht.scale(torch.tensor(1.0))


class ResumeTest(unittest.TestCase):
    def test_state_round_trips_and_the_next_step_follows(self):
        a = make(total_steps=10)
        for _ in range(3):
            a.begin_step()
        state = a.state_dict()  # inside step 3: it counts as done
        self.assertEqual(state["step"], 3)
        b = make(total_steps=10)
        b.load_state_dict(state)
        self.assertEqual(b.begin_step(), 4)
        self.assertEqual(b.local_indices(4), a.sampler.global_indices(4))

    def test_a_different_sample_order_is_refused(self):
        state = make().state_dict()
        with self.assertRaisesRegex(ValueError, r"written with seed = 3, this run has 4"):
            make(seed=4).load_state_dict(state)
        with self.assertRaisesRegex(ValueError, "dataset of 64 samples, this run has 96"):
            make(dataset_size=96).load_state_dict(state)
        with self.assertRaisesRegex(ValueError, "not a heterotrain state"):
            make().load_state_dict({"step": 3})
        started = make()
        started.begin_step()
        with self.assertRaisesRegex(RuntimeError, "after training started"):
            started.load_state_dict(state)


class EnvironmentTest(unittest.TestCase):
    def test_the_jobs_training_fields_are_the_defaults(self):
        with mock.patch.dict(os.environ, {"HT_MAX_STEPS": "7", "HT_EPOCHS": "2", "HT_SEED": "5"}):
            ht = make(seed=None)
            self.assertEqual((ht.total_steps, ht.seed), (7, 5))
            self.assertEqual(make(seed=None, total_steps=3).total_steps, 3, "an argument wins")
        with mock.patch.dict(os.environ, {"HT_EPOCHS": "2"}):
            self.assertEqual(make(seed=None).total_steps, 4, "2 epochs of 2 steps")
        with mock.patch.dict(os.environ, {"HT_MAX_STEPS": "many"}):
            with self.assertRaisesRegex(ValueError, r"\$HT_MAX_STEPS is 'many', not an integer"):
                make()

    def test_load_checkpoint_gives_every_rank_rank_0s_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ckpt.pt")
            self.assertIsNone(heterotrain.load_checkpoint(path))
            torch.save({"heterotrain": {"step": 4}}, path)
            self.assertEqual(heterotrain.load_checkpoint(path), {"heterotrain": {"step": 4}})


class DatasetTest(unittest.TestCase):
    def test_iterable_datasets_are_refused_with_the_reason(self):
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter(range(10))

        with self.assertRaisesRegex(TypeError, "IterableDataset decides its own sample order"):
            make().batch_sampler(Stream())
        with self.assertRaisesRegex(ValueError, "dataset has 10 samples, the sampler 64"):
            make().batch_sampler(10)


if __name__ == "__main__":
    unittest.main()
