//! The Pod Security Standards' `baseline` and `restricted` checks, field by
//! field, as the upstream PodSecurity admission plugin defines them (its
//! "latest" version). The local control plane is Kubernetes 1.20, which has
//! no PodSecurity admission, so tests evaluate the pods the operator and the
//! chart render — and the pods the API server admitted — with these checks.
//!
//! Every container of the pod is checked: `containers`, `initContainers`
//! and `ephemeralContainers`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SecurityContext};

/// One failed check: its upstream name and what breaks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

/// Capabilities `baseline` lets a container add.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls `baseline` allows.
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types `baseline` allows (besides none).
const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume kinds `restricted` allows, as the Volume's JSON keys.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every container of `spec` with its name, init and ephemeral ones
/// included (an ephemeral container's security context in the same shape).
fn containers(spec: &PodSpec) -> Vec<(String, Option<SecurityContext>, Container)> {
    let mut out: Vec<(String, Option<SecurityContext>, Container)> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| (c.name.clone(), c.security_context.clone(), c.clone()))
        .collect();
    for e in spec.ephemeral_containers.iter().flatten() {
        let as_container = Container {
            name: e.name.clone(),
            ports: e.ports.clone(),
            security_context: e.security_context.clone(),
            ..Default::default()
        };
        out.push((e.name.clone(), e.security_context.clone(), as_container));
    }
    out
}

/// The checks of `baseline` that `pod` fails.
pub fn baseline(pod: &Pod) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut fail = |check: &'static str, detail: String| v.push(Violation { check, detail });
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let psc = spec.security_context.clone().unwrap_or_default();
    for (field, set) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if set == Some(true) {
            fail("hostNamespaces", format!("{field}=true"));
        }
    }
    if psc
        .windows_options
        .as_ref()
        .and_then(|w| w.host_process)
        .unwrap_or(false)
    {
        fail("hostProcess", "pod windowsOptions.hostProcess=true".into());
    }
    for vol in spec.volumes.iter().flatten() {
        if vol.host_path.is_some() {
            fail("hostPathVolumes", format!("volume {:?}", vol.name));
        }
    }
    let annotations: BTreeMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default();
    for (k, val) in &annotations {
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && val != "runtime/default"
            && !val.starts_with("localhost/")
        {
            fail("appArmorProfile", format!("{k}={val}"));
        }
        if (k == "seccomp.security.alpha.kubernetes.io/pod"
            || k.starts_with("container.seccomp.security.alpha.kubernetes.io/"))
            && val == "unconfined"
        {
            fail("seccompProfile_baseline", format!("{k}={val}"));
        }
    }
    let apparmor_ok = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    if let Some(a) = &psc.app_armor_profile {
        if !apparmor_ok(&a.type_) {
            fail(
                "appArmorProfile",
                format!("pod appArmorProfile {}", a.type_),
            );
        }
    }
    let selinux_bad = |o: &k8s_openapi::api::core::v1::SELinuxOptions| {
        o.type_
            .as_deref()
            .is_some_and(|t| !t.is_empty() && !SELINUX_TYPES.contains(&t))
            || o.user.as_deref().is_some_and(|u| !u.is_empty())
            || o.role.as_deref().is_some_and(|r| !r.is_empty())
    };
    if psc.se_linux_options.as_ref().is_some_and(selinux_bad) {
        fail("seLinuxOptions", "pod seLinuxOptions".into());
    }
    if psc
        .seccomp_profile
        .as_ref()
        .is_some_and(|s| s.type_ == "Unconfined")
    {
        fail(
            "seccompProfile_baseline",
            "pod seccompProfile Unconfined".into(),
        );
    }
    for s in psc.sysctls.iter().flatten() {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            fail("sysctls", s.name.clone());
        }
    }
    for (name, sc, c) in containers(spec) {
        for p in c.ports.iter().flatten() {
            if p.host_port.is_some_and(|h| h != 0) {
                fail("hostPorts", format!("container {name:?} hostPort"));
            }
        }
        let Some(sc) = sc else { continue };
        if sc.privileged == Some(true) {
            fail("privileged", format!("container {name:?}"));
        }
        for cap in sc
            .capabilities
            .as_ref()
            .and_then(|c| c.add.clone())
            .unwrap_or_default()
        {
            if !BASELINE_CAPABILITIES.contains(&cap.as_str()) {
                fail(
                    "capabilities_baseline",
                    format!("container {name:?} adds {cap}"),
                );
            }
        }
        if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            fail("procMount", format!("container {name:?}"));
        }
        if sc
            .windows_options
            .as_ref()
            .and_then(|w| w.host_process)
            .unwrap_or(false)
        {
            fail("hostProcess", format!("container {name:?}"));
        }
        if sc.se_linux_options.as_ref().is_some_and(selinux_bad) {
            fail("seLinuxOptions", format!("container {name:?}"));
        }
        if let Some(a) = &sc.app_armor_profile {
            if !apparmor_ok(&a.type_) {
                fail("appArmorProfile", format!("container {name:?} {}", a.type_));
            }
        }
        if sc
            .seccomp_profile
            .as_ref()
            .is_some_and(|s| s.type_ == "Unconfined")
        {
            fail(
                "seccompProfile_baseline",
                format!("container {name:?} Unconfined"),
            );
        }
    }
    v
}

/// The checks of `restricted` (which includes `baseline`) that `pod` fails.
pub fn restricted(pod: &Pod) -> Vec<Violation> {
    let mut v = baseline(pod);
    let mut fail = |check: &'static str, detail: String| v.push(Violation { check, detail });
    let Some(spec) = pod.spec.as_ref() else {
        return v;
    };
    let psc = spec.security_context.clone().unwrap_or_default();
    for vol in spec.volumes.iter().flatten() {
        let json = serde_json::to_value(vol).unwrap_or_default();
        let kinds: Vec<String> = json
            .as_object()
            .map(|o| o.keys().filter(|k| *k != "name").cloned().collect())
            .unwrap_or_default();
        for k in kinds {
            if !RESTRICTED_VOLUMES.contains(&k.as_str()) {
                fail("restrictedVolumes", format!("volume {:?} is {k}", vol.name));
            }
        }
    }
    if psc.run_as_user == Some(0) {
        fail("runAsUser", "pod runAsUser=0".into());
    }
    if psc.run_as_non_root == Some(false) {
        fail("runAsNonRoot", "pod runAsNonRoot=false".into());
    }
    let pod_seccomp_ok = psc
        .seccomp_profile
        .as_ref()
        .is_some_and(|s| s.type_ == "RuntimeDefault" || s.type_ == "Localhost");
    for (name, sc, _) in containers(spec) {
        let sc = sc.unwrap_or_default();
        if sc.allow_privilege_escalation != Some(false) {
            fail(
                "allowPrivilegeEscalation",
                format!("container {name:?} must set allowPrivilegeEscalation=false"),
            );
        }
        match sc.run_as_non_root {
            Some(false) => fail(
                "runAsNonRoot",
                format!("container {name:?} runAsNonRoot=false"),
            ),
            None if psc.run_as_non_root != Some(true) => fail(
                "runAsNonRoot",
                format!("container {name:?}: runAsNonRoot unset at pod and container level"),
            ),
            _ => {}
        }
        if sc.run_as_user == Some(0) {
            fail("runAsUser", format!("container {name:?} runAsUser=0"));
        }
        match sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) {
            Some("RuntimeDefault") | Some("Localhost") => {}
            None if pod_seccomp_ok => {}
            other => fail(
                "seccompProfile_restricted",
                format!("container {name:?} seccompProfile {other:?} (pod's: {pod_seccomp_ok})"),
            ),
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if !caps.drop.iter().flatten().any(|c| c == "ALL") {
            fail(
                "capabilities_restricted",
                format!("container {name:?} does not drop ALL"),
            );
        }
        for cap in caps.add.iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                fail(
                    "capabilities_restricted",
                    format!("container {name:?} adds {cap}"),
                );
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn compliant() -> Value {
        json!({
            "metadata": {"name": "p"},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "volumes": [{"name": "d", "emptyDir": {}},
                            {"name": "c", "persistentVolumeClaim": {"claimName": "x"}}],
                "containers": [{
                    "name": "main", "image": "i",
                    "ports": [{"containerPort": 80}],
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
                }]
            }
        })
    }

    fn checks(v: Value) -> Vec<&'static str> {
        let pod: Pod = serde_json::from_value(v).unwrap();
        let mut c: Vec<_> = restricted(&pod).into_iter().map(|v| v.check).collect();
        c.dedup();
        c
    }

    #[test]
    fn a_compliant_pod_passes() {
        assert_eq!(checks(compliant()), Vec::<&str>::new());
    }

    /// Each mutation of the compliant pod fails exactly its check.
    #[test]
    fn each_rule_catches_its_field() {
        type Mutation = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "hostNamespaces",
                Box::new(|p| p["spec"]["hostNetwork"] = json!(true)),
            ),
            (
                "hostNamespaces",
                Box::new(|p| p["spec"]["hostPID"] = json!(true)),
            ),
            (
                "hostNamespaces",
                Box::new(|p| p["spec"]["hostIPC"] = json!(true)),
            ),
            (
                "privileged",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true)
                }),
            ),
            (
                "capabilities_restricted",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                        json!(["CHOWN"])
                }),
            ),
            (
                "capabilities_restricted",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] =
                        json!(["NET_RAW"])
                }),
            ),
            (
                "hostPorts",
                Box::new(|p| p["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(80)),
            ),
            (
                "appArmorProfile",
                Box::new(|p| {
                    p["metadata"]["annotations"] =
                        json!({"container.apparmor.security.beta.kubernetes.io/main": "unconfined"})
                }),
            ),
            (
                "seLinuxOptions",
                Box::new(|p| {
                    p["spec"]["securityContext"]["seLinuxOptions"] = json!({"type": "spc_t"})
                }),
            ),
            (
                "seLinuxOptions",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["seLinuxOptions"] =
                        json!({"user": "root"})
                }),
            ),
            (
                "procMount",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["procMount"] = json!("Unmasked")
                }),
            ),
            (
                "sysctls",
                Box::new(|p| {
                    p["spec"]["securityContext"]["sysctls"] =
                        json!([{"name": "kernel.msgmax", "value": "1"}])
                }),
            ),
            (
                "hostProcess",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["windowsOptions"] =
                        json!({"hostProcess": true})
                }),
            ),
            (
                "restrictedVolumes",
                Box::new(|p| {
                    p["spec"]["volumes"][0] =
                        json!({"name": "d", "nfs": {"server": "s", "path": "/"}})
                }),
            ),
            (
                "allowPrivilegeEscalation",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                        json!(true)
                }),
            ),
            (
                "allowPrivilegeEscalation",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]
                        .as_object_mut()
                        .unwrap()
                        .remove("allowPrivilegeEscalation");
                }),
            ),
            (
                "runAsNonRoot",
                Box::new(|p| {
                    p["spec"]["securityContext"]
                        .as_object_mut()
                        .unwrap()
                        .remove("runAsNonRoot");
                }),
            ),
            (
                "runAsNonRoot",
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = json!(false)
                }),
            ),
            (
                "runAsUser",
                Box::new(|p| p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(0)),
            ),
            (
                "seccompProfile_restricted",
                Box::new(|p| {
                    p["spec"]["securityContext"]
                        .as_object_mut()
                        .unwrap()
                        .remove("seccompProfile");
                }),
            ),
        ];
        for (want, mutate) in &cases {
            let mut pod = compliant();
            mutate(&mut pod);
            assert_eq!(checks(pod.clone()), vec![*want], "{pod}");
        }
        // hostPath and Unconfined seccomp break baseline and restricted
        // alike; an init
        // container is checked like the others.
        let mut pod = compliant();
        pod["spec"]["volumes"][0] = json!({"name": "d", "hostPath": {"path": "/"}});
        assert_eq!(checks(pod), vec!["hostPathVolumes", "restrictedVolumes"]);
        let mut pod = compliant();
        pod["spec"]["securityContext"]["seccompProfile"] = json!({"type": "Unconfined"});
        assert_eq!(
            checks(pod),
            vec!["seccompProfile_baseline", "seccompProfile_restricted"]
        );
        let mut pod = compliant();
        pod["spec"]["initContainers"] = json!([{"name": "init", "image": "i"}]);
        assert_eq!(
            checks(pod),
            vec!["allowPrivilegeEscalation", "capabilities_restricted"]
        );
        // Pod-level runAsNonRoot may be replaced by every container's own.
        let mut pod = compliant();
        pod["spec"]["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("runAsNonRoot");
        pod["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = json!(true);
        assert_eq!(checks(pod), Vec::<&str>::new());
    }
}
