"""The parts that need no process group: plan contract, gate, sampler,
ConfigMap source, metrics exposition."""

import http.server
import json
import os
import re
import sys
import tempfile
import threading
import time
import unittest

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import PKG_ROOT, promtool, promtool_check  # noqa: E402

sys.path.insert(0, PKG_ROOT)
from heterotrain import BatchPlan, ConfigMapPlanSource, FilePlanSource, HeteroSampler, PlanError, PlanGate  # noqa: E402
from heterotrain.metrics import TrainerMetrics  # noqa: E402


class PlanTest(unittest.TestCase):
    def test_parses_the_wire_format(self):
        p = BatchPlan.parse(
            '{"generation":3,"globalBatchSize":32,"batchSizes":[20,9,3],"policy":"dynamic",'
            '"reason":"r","predictedStepSeconds":0.5}', 3)
        self.assertEqual(p.batch_sizes, [20, 9, 3])
        self.assertEqual(p.offset_of(2), 29)
        self.assertEqual(p.predicted_step_seconds, 0.5)
        self.assertEqual(BatchPlan.parse(p.to_json(), 3), p)
        self.assertEqual(json.loads(p.to_json())["globalBatchSize"], 32)

    def test_refuses_bad_plans_with_the_rust_labels(self):
        bad = [
            ("garbage", "parse"),
            ('{"generation":1,"globalBatchSize":32,"batchSizes":[0,16,16]}', "zero_batch"),
            ('{"generation":1,"globalBatchSize":32,"batchSizes":[16,16]}', "wrong_length"),
            ('{"generation":1,"globalBatchSize":32,"batchSizes":[16,8,7]}', "wrong_sum"),
            ('{"generation":-1,"globalBatchSize":32,"batchSizes":[16,8,8]}', "parse"),
            ('{"generation":1,"globalBatchSize":32,"batchSizes":[16,8.5,7.5]}', "parse"),
            ('{"globalBatchSize":32,"batchSizes":[16,8,8]}', "parse"),
            ('[1,2,3]', "parse"),
        ]
        for text, label in bad:
            with self.assertRaises(PlanError, msg=text) as cm:
                BatchPlan.parse(text, 3)
            self.assertEqual(cm.exception.label, label, text)

    def test_ranks_other_than_zero_may_be_left_out(self):
        p = BatchPlan.parse('{"generation":2,"globalBatchSize":32,"batchSizes":[20,0,12,0]}', 4)
        self.assertEqual(p.members(), [0, 2])

    def test_equal_split(self):
        self.assertEqual(BatchPlan.equal(0, 10, 3).batch_sizes, [4, 3, 3])

    def test_gate(self):
        labels = []
        gate = PlanGate(on_reject=labels.append)
        cur = BatchPlan.equal(0, 32, 3)
        # The default equal split yields to a written plan of the same generation.
        p = gate.consider('{"generation":0,"globalBatchSize":32,"batchSizes":[20,9,3]}', cur, 3)
        self.assertEqual(p.batch_sizes, [20, 9, 3])
        cur = p
        self.assertIsNone(gate.consider(cur.to_json(), cur, 3))  # the same plan again: silent
        self.assertIsNone(gate.consider('{"generation":0,"globalBatchSize":32,"batchSizes":[30,1,1]}', cur, 3))
        self.assertIsNone(gate.consider('{"generation":5,"globalBatchSize":33,"batchSizes":[31,1,1]}', cur, 3))
        self.assertIsNone(gate.consider('not json', cur, 3))
        self.assertEqual(labels, ["old_generation", "global_mismatch", "parse"])
        self.assertEqual(gate.rejected, 3)
        self.assertEqual(gate.consider('{"generation":1,"globalBatchSize":32,"batchSizes":[30,0,2]}',
                                       cur, 3).batch_sizes, [30, 0, 2])

    def test_file_source_reports_changes_once(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            src = FilePlanSource(path)
            self.assertIsNone(src.poll())  # missing: no proposal
            with open(path, "w") as f:
                f.write("a")
            self.assertEqual(src.poll(), "a")
            self.assertIsNone(src.poll())
            with open(path, "w") as f:
                f.write("b")
            self.assertEqual(src.poll(), "b")


class SamplerTest(unittest.TestCase):
    def test_slices_partition_the_global_batch(self):
        s = HeteroSampler(100, 32, seed=7, shuffle=True)
        for sizes in ([20, 9, 3], [32, 0, 0], [1, 30, 1], [11, 0, 21]):
            p = BatchPlan(1, 32, sizes)
            for step in (1, 3, 4, 11):
                union = [i for r in range(3) for i in s.rank_indices(step, p, r)]
                self.assertEqual(union, s.global_indices(step))
                self.assertEqual(len(set(union)), 32)

    def test_epochs_and_order(self):
        s = HeteroSampler(10, 3, shuffle=False)
        self.assertEqual(s.steps_per_epoch, 3)
        self.assertEqual(s.position(4), (1, 0))
        self.assertEqual(s.rank_indices(3, BatchPlan(1, 3, [2, 1]), 0), [6, 7])
        self.assertEqual(s.rank_indices(3, BatchPlan(1, 3, [2, 1]), 1), [8])
        sh = HeteroSampler(100, 10, seed=1)
        e0 = [i for st in range(1, 11) for i in sh.global_indices(st)]
        e1 = [i for st in range(11, 21) for i in sh.global_indices(st)]
        self.assertEqual(sorted(e0), list(range(100)))
        self.assertNotEqual(e0, e1)
        self.assertEqual(e0, HeteroSampler(100, 10, seed=1).global_indices(1) + e0[10:])


class ConfigMapSourceTest(unittest.TestCase):
    """The GET the library makes, against a local stand-in for the API server."""

    def test_reads_plan_json_with_the_token(self):
        seen = []
        body = {"kind": "ConfigMap", "data": {"plan.json": '{"generation":4}'}}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                seen.append((self.path, self.headers.get("Authorization")))
                code, data = (200, json.dumps(body).encode()) if self.path.endswith("/job-plan") else (404, b"{}")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            with tempfile.TemporaryDirectory() as sa:
                with open(os.path.join(sa, "token"), "w") as f:
                    f.write("secret-token\n")
                base = f"http://127.0.0.1:{srv.server_port}"
                # A generous HTTP timeout: the stand-in server is a thread of
                # this process, which a loaded machine may leave waiting.
                src = ConfigMapPlanSource("job-plan", namespace="ns1", base_url=base, sa_dir=sa, interval=0.05,
                                          timeout=30.0)
                self.assertEqual(src.fetch(), '{"generation":4}')
                self.assertEqual(seen[0], ("/api/v1/namespaces/ns1/configmaps/job-plan", "Bearer secret-token"))
                src.start()
                self.assertEqual(src.poll(), '{"generation":4}')
                self.assertIsNone(src.poll())  # unchanged: reported once
                body["data"]["plan.json"] = '{"generation":5}'
                # The watch thread fetches every 0.05 s; wait for the change
                # by a deadline, not a count of polls (a loaded machine may
                # not run that thread for seconds).
                deadline = time.monotonic() + 60
                text = src.poll()
                while text is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    text = src.poll()
                self.assertEqual(text, '{"generation":5}')
                src.close()
                missing = ConfigMapPlanSource("absent", namespace="ns1", base_url=base, sa_dir=sa)
                self.assertIsNone(missing.fetch())
        finally:
            srv.shutdown()
            srv.server_close()


class MetricsTest(unittest.TestCase):
    def test_names_types_and_promtool(self):
        m = TrainerMetrics()
        m.set_position(0, 0, 100)
        m.set_plan(2, 20)
        m.observe_step(1, 0, 20, {"data": 0.01, "forward": 0.1, "backward": 0.2, "allreduce": 0.05,
                                  "optimizer": 0.02}, 0.4, 0.33, 1.5)
        m.plan_rejected_inc("parse")
        text = m.text()
        for name, kind in [("heterotrain_phase_seconds_total", "counter"), ("heterotrain_samples_total", "counter"),
                           ("heterotrain_steps_total", "counter"), ("heterotrain_compute_seconds_total", "counter"),
                           ("heterotrain_plan_rejected_total", "counter"), ("heterotrain_step_seconds", "histogram"),
                           ("heterotrain_local_batch_size", "gauge"), ("heterotrain_plan_generation", "gauge"),
                           ("heterotrain_step", "gauge"), ("heterotrain_epoch", "gauge"),
                           ("heterotrain_total_steps", "gauge"), ("heterotrain_loss", "gauge"),
                           ("heterotrain_finished", "gauge"), ("heterotrain_last_step_compute_seconds", "gauge"),
                           ("heterotrain_compute_seconds_per_sample", "gauge"),
                           ("process_cpu_seconds_total", "counter"), ("process_resident_memory_bytes", "gauge")]:
            self.assertIn(f"# TYPE {name} {kind}\n", text)
        self.assertRegex(text, r'heterotrain_phase_seconds_total\{phase="backward"\} 0\.2\n')
        self.assertRegex(text, r"heterotrain_samples_total 20\.0\n")
        self.assertRegex(text, r'heterotrain_plan_rejected_total\{reason="parse"\} 1\.0\n')
        self.assertNotIn("_created", text)
        self.assertIsNone(re.search(r"^heterotrain_samples ", text, re.M))
        self.assertIsNotNone(promtool(), "promtool not found (on PATH or under $HETEROTRAIN_CACHE): run `make setup`")
        code, out = promtool_check(text)
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
