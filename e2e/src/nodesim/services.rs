//! What kube-proxy does for a real node, for the connections the local
//! control plane makes: every Service with a selector gets a listener on
//! its ClusterIP (a loopback address: the local API server hands them out
//! from a 127.x.0.0/16 range of its own) and port, and each connection is
//! forwarded to the target port of one Ready pod the selector picks. The
//! API server calling an admission webhook through its Service goes this
//! way (the Endpoints controller cannot publish loopback pod IPs).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::Client;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A forwarded Service port: namespace, name, ClusterIP and port.
type Key = (String, String, String, i32);

/// Keep one listener per Service port, re-reading the Services every
/// second, for ever.
pub async fn proxy_services(client: Client) {
    let mut live: HashMap<Key, JoinHandle<()>> = HashMap::new();
    let services: Api<Service> = Api::all(client.clone());
    loop {
        if let Ok(list) = services.list(&ListParams::default()).await {
            let mut want: HashMap<Key, (BTreeMap<String, String>, ServicePort)> = HashMap::new();
            for s in list.items {
                let (Some(ns), Some(name), Some(spec)) =
                    (s.metadata.namespace, s.metadata.name, s.spec)
                else {
                    continue;
                };
                let (Some(ip), Some(selector)) = (spec.cluster_ip, spec.selector) else {
                    continue;
                };
                if ip == "None" || !ip.starts_with("127.") || selector.is_empty() {
                    continue;
                }
                for p in spec.ports.unwrap_or_default() {
                    if p.protocol.as_deref().unwrap_or("TCP") == "TCP" {
                        want.insert(
                            (ns.clone(), name.clone(), ip.clone(), p.port),
                            (selector.clone(), p),
                        );
                    }
                }
            }
            live.retain(|k, task| {
                let keep = want.contains_key(k) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            for (key, (selector, port)) in want {
                if let std::collections::hash_map::Entry::Vacant(slot) = live.entry(key) {
                    let key = slot.key().clone();
                    slot.insert(tokio::spawn(forward(client.clone(), key, selector, port)));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Accept on the Service's `ip:port` and forward each connection.
async fn forward(client: Client, key: Key, selector: BTreeMap<String, String>, port: ServicePort) {
    let (ns, name, ip, number) = key;
    let listener = match TcpListener::bind((ip.as_str(), number as u16)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nodesim: Service {ns}/{name}: cannot listen on {ip}:{number}: {e}");
            // Tried again on the next pass.
            tokio::time::sleep(Duration::from_secs(5)).await;
            return;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let labels = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let (pods, labels, port) = (pods.clone(), labels.clone(), port.clone());
        tokio::spawn(async move {
            let Some(target) = ready_target(&pods, &labels, &port).await else {
                return;
            };
            if let Ok(mut outbound) = TcpStream::connect(&target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// `ip:port` of a Ready pod the selector picks, the Service port's target
/// resolved (a number, or a container port's name).
async fn ready_target(pods: &Api<Pod>, labels: &str, port: &ServicePort) -> Option<String> {
    let list = pods
        .list(&ListParams::default().labels(labels))
        .await
        .ok()?;
    list.items.into_iter().find_map(|p| {
        let status = p.status?;
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready || p.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let ip = status.pod_ip?;
        let target = match &port.target_port {
            None => port.port,
            Some(IntOrString::Int(n)) => *n,
            Some(IntOrString::String(named)) => {
                p.spec?
                    .containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|cp| cp.name.as_deref() == Some(named.as_str()))?
                    .container_port
            }
        };
        Some(format!("{ip}:{target}"))
    })
}
