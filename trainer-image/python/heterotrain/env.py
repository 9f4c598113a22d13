"""Environment variables of the operator -> trainer contract.

The same names as the Rust side's ``env`` module (crds/src/trainer/mod.rs):
the operator sets them on rank pods, and a user may set them by hand.
"""

RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
#: The pod's IP (downward API): where ``/metrics`` binds.
POD_IP = "POD_IP"
#: The pod's namespace: where the plan ConfigMap lives.
NAMESPACE = "HETEROTRAIN_NAMESPACE"
#: The plan ConfigMap rank 0 watches.
PLAN_CONFIGMAP = "HETEROTRAIN_PLAN_CONFIGMAP"
#: A plan file (runs without Kubernetes).
PLAN_FILE = "HT_PLAN_FILE"
#: Port of ``/metrics`` (default 9400; 0 picks a free port).
METRICS_PORT = "HT_METRICS_PORT"
#: Global batch size B (a user may set it instead of an argument).
BATCH_SIZE = "HT_BATCH_SIZE"

#: The job's training fields, set by the operator for a job's own command:
#: the defaults of ``init(total_steps=, epochs=, seed=)``, and where and how
#: often the script should checkpoint.
MAX_STEPS = "HT_MAX_STEPS"
EPOCHS = "HT_EPOCHS"
SEED = "HT_SEED"
CHECKPOINT_DIR = "HT_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "HT_CHECKPOINT_EVERY"

#: Default metrics port, as the Rust trainer's.
DEFAULT_METRICS_PORT = 9400

#: Key of the plan inside the plan ConfigMap.
PLAN_KEY = "plan.json"

#: Where Kubernetes mounts the pod's service-account credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
