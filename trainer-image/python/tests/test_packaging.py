"""`make wheel`: the wheel builds, carries the workspace's version, and
installs into a fresh directory from which the library imports."""

import os
import re
import subprocess
import sys
import tempfile
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import PKG_ROOT, REPO_ROOT  # noqa: E402


def workspace_version() -> str:
    with open(os.path.join(REPO_ROOT, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


class WheelTest(unittest.TestCase):
    def test_wheel_builds_installs_and_imports(self):
        version = workspace_version()
        with tempfile.TemporaryDirectory(prefix="ht-wheel-") as tmp:
            out = os.path.join(tmp, "wheels")
            r = subprocess.run(["bash", os.path.join(PKG_ROOT, "build-wheel.sh"), sys.executable, out],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            wheels = os.listdir(out)
            self.assertEqual(wheels, [f"heterotrain-{version}-py3-none-any.whl"])
            wheel = os.path.join(out, wheels[0])
            with zipfile.ZipFile(wheel) as z:
                names = z.namelist()
            for module in ("core", "loader", "hook", "plan", "sampler", "sources", "metrics", "env"):
                self.assertIn(f"heterotrain/{module}.py", names)
            self.assertFalse([n for n in names if n.startswith("tests/")], "tests are not shipped")
            site = os.path.join(tmp, "site")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                "--target", site, wheel], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = site
            r = subprocess.run([sys.executable, "-c",
                                "import heterotrain as h; print(h.__file__); print(h.__version__); "
                                "print(h.HeteroBatchSampler.__name__)"],
                               capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            file, got, name = r.stdout.split()
            self.assertTrue(file.startswith(site), f"imported from {file}, not the installed wheel")
            self.assertEqual(got, version)
            self.assertEqual(name, "HeteroBatchSampler")
        self.assertFalse(os.path.exists(os.path.join(PKG_ROOT, "build")), "the build leaves the clone clean")


if __name__ == "__main__":
    unittest.main()
