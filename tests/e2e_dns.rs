//! Cluster DNS on the real node (`hack/real-node.sh`: CoreDNS with its kubernetes plugin on the
//! kube-dns ClusterIP, the kubelet's `clusterDNS`): a pod of a StatefulSet resolves another member
//! by its stable name under the headless Service, `<pod>.<service>.<namespace>.svc.cluster.local`,
//! to that pod's IP; the Service name gives every member; a short name resolves through the pod's
//! search path (and the pod answers a ping there); a name that does not exist is NXDOMAIN.
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_dns` (or `make e2e`).

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use serde_json::json;
use support::{
    Cluster, REAL_NODE, from_json, real_node_ready, real_node_selector, real_node_skipped,
    real_node_toleration, wait_for, wait_for_some,
};

const SET: &str = "web";
const TIMEOUT: Duration = Duration::from_secs(120);

/// The IPv4 addresses in busybox `nslookup` output after the `Name:` line of the answer (the
/// server's own address comes before it).
fn answers(out: &str) -> Vec<String> {
    let mut ips: Vec<String> = out
        .split("Name:")
        .skip(1)
        .flat_map(|answer| answer.lines())
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(|a| a.trim().to_string())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// `nslookup NAME` in pod `from` (exit status, output).
async fn lookup(cluster: &Cluster, ns: &str, from: &str, name: &str) -> (bool, String) {
    let out = tokio::process::Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["-n", ns, "exec", from, "--", "nslookup", name])
        .output()
        .await
        .expect("run kubectl exec");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_resolves_a_member_of_a_headless_service_from_another_pod() {
    let cluster = Cluster::connect().await;
    if !real_node_ready(&cluster.client).await {
        if let Some(why) = real_node_skipped() {
            eprintln!("e2e_dns: SKIPPED, no real node in this cluster: {why}");
            return;
        }
        panic!("e2e: node {REAL_NODE} is not Ready; hack/cluster.sh up starts it");
    }
    let ns = cluster.namespace("dns-headless").await;
    let service: Service = from_json(json!({
        "metadata": {"name": SET},
        "spec": {"clusterIP": "None", "selector": {"app": SET}, "ports": [{"port": 80}]}
    }));
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await
        .expect("create service");
    let set: StatefulSet = from_json(json!({
        "metadata": {"name": SET},
        "spec": {
            "replicas": 2, "serviceName": SET, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": SET}},
            "template": {"metadata": {"labels": {"app": SET}}, "spec": {
                "tolerations": [real_node_toleration()], "nodeSelector": real_node_selector(),
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]}]}}
        }
    }));
    let sets: Api<StatefulSet> = ns.api();
    sets.create(&PostParams::default(), &set)
        .await
        .expect("create statefulset");
    wait_for("2 ready members", TIMEOUT, || async {
        let s = sets.get_opt(SET).await.ok().flatten();
        s.and_then(|s| s.status).and_then(|s| s.ready_replicas) == Some(2)
    })
    .await;
    let pods: Api<Pod> = ns.api();
    let mut ips = Vec::new();
    for o in 0..2 {
        let pod = pods.get(&format!("{SET}-{o}")).await.expect("get pod");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(REAL_NODE)
        );
        let ip = pod.status.and_then(|s| s.pod_ip).expect("pod IP");
        ips.push(ip);
    }

    // Per pod: web-1 finds web-0 by its stable name (once the endpoint is published).
    let fqdn = format!("{SET}-0.{SET}.{}.svc.cluster.local", ns.name);
    let got = wait_for_some(&format!("{fqdn} from {SET}-1"), TIMEOUT, || async {
        let (ok, out) = lookup(&cluster, &ns.name, &format!("{SET}-1"), &fqdn).await;
        let found = answers(&out);
        (ok && !found.is_empty()).then_some((found, out))
    })
    .await;
    assert_eq!(got.0, [ips[0].clone()], "{fqdn}: {}", got.1);
    eprintln!("e2e_dns: {fqdn} -> {:?} (pod IP {})", got.0, ips[0]);

    // The headless Service's name: every ready member.
    let all = format!("{SET}.{}.svc.cluster.local", ns.name);
    let (ok, out) = lookup(&cluster, &ns.name, &format!("{SET}-0"), &all).await;
    let mut want = ips.clone();
    want.sort();
    assert!(ok, "{all}: {out}");
    assert_eq!(answers(&out), want, "{all}: {out}");

    // A short name through the search path of the pod's resolv.conf, as the C library resolves
    // it (busybox `nslookup` asks for the name as given; `ping` goes through getaddrinfo).
    let short = format!("{SET}-1.{SET}");
    let out = cluster
        .kubectl(&[
            "-n",
            &ns.name,
            "exec",
            &format!("{SET}-0"),
            "--",
            "ping",
            "-c",
            "1",
            "-W",
            "5",
            &short,
        ])
        .await;
    let want_line = format!("PING {short} ({})", ips[1]);
    assert!(out.contains(&want_line), "{short}: {out}");

    // No such member: NXDOMAIN, not an address.
    let missing = format!("{SET}-7.{SET}.{}.svc.cluster.local", ns.name);
    let (ok, out) = lookup(&cluster, &ns.name, &format!("{SET}-0"), &missing).await;
    assert!(
        !ok && out.contains("NXDOMAIN") && answers(&out).is_empty(),
        "{missing}: {out}"
    );
}
