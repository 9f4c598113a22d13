{{/*
The operator's RBAC rules, split by scope exactly as operator/src/rbac.rs
(`heterotrain-operator rbac`, operator/rbac.yaml); the chart tests compare
them. Each rule says why the operator needs it.
*/}}

{{/* Rules in every namespace whose jobs the operator reconciles. */}}
{{- define "heterotrain.operator.namespacedRules" -}}
# watch jobs; delete finished jobs after ttlSecondsAfterFinished
- apiGroups: ["heterotrain.dev"]
  resources: ["heterotrainingjobs"]
  verbs: ["get", "list", "watch", "delete"]
# report conditions, plan generation, balance and restarts
- apiGroups: ["heterotrain.dev"]
  resources: ["heterotrainingjobs/status"]
  verbs: ["patch"]
# set blockOwnerDeletion owner references on children (OwnerReferencesPermissionEnforcement)
- apiGroups: ["heterotrain.dev"]
  resources: ["heterotrainingjobs/finalizers"]
  verbs: ["update"]
# create rank pods (server-side apply), watch their phase, delete a gang to restart or suspend it
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# the headless rendezvous Service of each job
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# plan ConfigMaps of jobs (and, cluster-wide, the profile cache)
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Events on jobs (Rebalanced, GangRestarting, Invalid, ...)
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# each job's trainer Role and RoleBinding `<job>-trainer`: read its own plan ConfigMap only (server-side apply; never read, listed or deleted: they go with the job)
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
# each job's NetworkPolicies (server-side apply; deleted when the job turns isolation off)
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch", "delete"]
# the PodGroup of a job with runPolicy.schedulingPolicy where Volcano is installed (server-side apply)
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch"]
# the PodGroup of a job with runPolicy.schedulingPolicy where scheduler-plugins is installed (server-side apply)
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch"]
{{- end }}

{{/* Cluster-scoped rules: reads, and the reviews of /metrics tokens. */}}
{{- define "heterotrain.operator.clusterRules" -}}
# wait at start until the HeteroTrainingJob CRD is established
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get"]
# the accelerator label of the node a rank ran on (profile-cache key)
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
# check the bearer token of a /metrics request (--metrics-auth)
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
# check that the token's user may get /metrics (--metrics-auth)
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}

{{/* The operator's own Lease (pre-created by operator-state.yaml): no create. */}}
{{- define "heterotrain.operator.leaseRule" -}}
# leader election between replicas, on the operator's own Lease
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: ["heterotrain-operator"]
  verbs: ["get", "update"]
{{- end }}

{{/* The profile cache (pre-created by operator-state.yaml): no create. */}}
{{- define "heterotrain.operator.profileCacheRule" -}}
# the hardware-profile cache in the operator's namespace
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames: ["heterotrain-profile-cache"]
  verbs: ["get", "patch", "update"]
{{- end }}

{{/* A binding's subject: the operator's ServiceAccount. */}}
{{- define "heterotrain.operator.subjects" -}}
- kind: ServiceAccount
  name: {{ include "heterotrain.operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
