//! The API server's audit log (`target/cluster/logs/audit.log`, policy `hack/audit-policy.yaml`:
//! every create, delete, patch and update of pods, claims and StatefulSets, one JSON line each):
//! who deleted a cleanup pod, and which of the controller's record patches the API server refused.
//! The watches see that a pod went away; only the audit log says who sent the DELETE.
//!
//! A phase takes a [`Mark`] (file, inode and size) before its first scale-down and reads what was
//! appended since, keeping only its own namespaces' entries. The log rotates at 200 MB into one
//! backup (`audit-<time>.log`); a rotation in between is followed through the backup's inode.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use statefulset_scaledown_controller::scaledown::act::FIELD_MANAGER;

use crate::support;

/// The actor name of requests sent with the controller's identity (see [`Identity`]).
pub const CONTROLLER: &str = "controller";

/// Where the phase's part of the audit log starts.
#[derive(Clone, Debug)]
pub struct Mark {
    path: PathBuf,
    inode: u64,
    offset: u64,
}

/// One audit entry (stage ResponseComplete) of the phase's namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub code: u16,
    pub user: String,
    pub user_agent: String,
    pub uri: String,
    /// `requestReceivedTimestamp` and `stageTimestamp`, ms since the Unix epoch.
    pub received_unix_ms: f64,
    pub done_unix_ms: f64,
}

impl Entry {
    /// A request the controller marked with its field manager (creates and patches; its deletes
    /// carry none).
    pub fn has_our_field_manager(&self) -> bool {
        self.uri.contains(&format!("fieldManager={FIELD_MANAGER}"))
    }
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// What the phase's part of the log held.
#[derive(Debug, Default)]
pub struct Slice {
    pub entries: Vec<Entry>,
    /// Lines of other namespaces: other clients' writes to pods, claims and sets meanwhile (on a
    /// fresh cluster, next to none).
    pub other_lines: usize,
    /// The log rotated in between and the rotated part was not found: entries may be missing.
    pub incomplete: bool,
}

fn path() -> PathBuf {
    support::cluster_state_dir().join("logs/audit.log")
}

/// The end of the audit log now; None if the cluster writes none.
pub fn mark() -> Option<Mark> {
    let path = path();
    let meta = std::fs::metadata(&path).ok()?;
    Some(Mark {
        path,
        inode: meta.ino(),
        offset: meta.len(),
    })
}

/// The entries of `namespaces` appended since `mark` (a partial last line is left out).
pub fn read_since(mark: &Mark, namespaces: &[String]) -> Slice {
    let mut out = Slice::default();
    let needles: Vec<String> = namespaces
        .iter()
        .map(|ns| format!("\"namespace\":\"{ns}\""))
        .collect();
    let current = std::fs::metadata(&mark.path).map(|m| m.ino()).ok();
    if current == Some(mark.inode) {
        scan(&mark.path, mark.offset, &needles, &mut out);
        return out;
    }
    // Rotated: the rest of the old file is the backup with the old inode, then the new file.
    match rotated(&mark.path, mark.inode) {
        Some(old) => scan(&old, mark.offset, &needles, &mut out),
        None => out.incomplete = true,
    }
    scan(&mark.path, 0, &needles, &mut out);
    out
}

fn rotated(path: &Path, inode: u64) -> Option<PathBuf> {
    std::fs::read_dir(path.parent()?)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == inode))
}

fn scan(path: &Path, offset: u64, needles: &[String], out: &mut Slice) {
    let Ok(mut file) = std::fs::File::open(path) else {
        out.incomplete = true;
        return;
    };
    if file.seek(SeekFrom::Start(offset)).is_err() {
        out.incomplete = true;
        return;
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with('\n') => break,
            Ok(_) => {}
        }
        if !needles.iter().any(|n| line.contains(n.as_str())) {
            out.other_lines += 1;
            continue;
        }
        if let Some(entry) = parse(&line) {
            out.entries.push(entry);
        }
    }
}

/// One line of the log, if it is a ResponseComplete entry.
pub fn parse(line: &str) -> Option<Entry> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v["stage"] != "ResponseComplete" {
        return None;
    }
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let o = &v["objectRef"];
    Some(Entry {
        verb: s(&v["verb"]),
        resource: s(&o["resource"]),
        subresource: s(&o["subresource"]),
        name: s(&o["name"]),
        code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        user: s(&v["user"]["username"]),
        user_agent: s(&v["userAgent"]),
        uri: s(&v["requestURI"]),
        received_unix_ms: unix_ms(v["requestReceivedTimestamp"].as_str()?)?,
        done_unix_ms: unix_ms(v["stageTimestamp"].as_str()?)?,
    })
}

/// `2026-11-25T12:42:35.417187Z` as ms since the Unix epoch (UTC only, as the audit log writes).
pub fn unix_ms(t: &str) -> Option<f64> {
    let (date, time) = t.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut h = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (h.next()??, h.next()??, h.next()??);
    let frac: f64 = if frac.is_empty() {
        0.0
    } else {
        format!("0.{frac}").parse().ok()?
    };
    // Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some((seconds as f64 + frac) * 1000.0)
}

/// Who the controller is in the log: the user and user agent of the requests that carry its field
/// manager (the bench's own requests carry none; KWOK shares the admin user but names itself in
/// its user agent).
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    pub user: String,
    pub user_agent: String,
}

pub fn identity(entries: &[Entry]) -> Option<Identity> {
    entries
        .iter()
        .find(|e| e.has_our_field_manager())
        .map(|e| Identity {
            user: e.user.clone(),
            user_agent: e.user_agent.clone(),
        })
}

/// A short name of who sent a request: [`CONTROLLER`], `kwok`, `kube-controller-manager
/// (statefulset-controller)`, `kube-scheduler`, or the user agent's product or the user.
pub fn actor(e: &Entry, controller: Option<&Identity>) -> String {
    if controller.is_some_and(|c| c.user == e.user && c.user_agent == e.user_agent) {
        return CONTROLLER.to_string();
    }
    let product = e.user_agent.split('/').next().unwrap_or_default();
    if product == "kube-controller-manager" {
        let account = e
            .user_agent
            .rsplit_once("system:serviceaccount:kube-system:")
            .map_or(e.user.as_str(), |(_, a)| a);
        return format!("kube-controller-manager ({account})");
    }
    if product.is_empty() {
        return e.user.clone();
    }
    product.to_string()
}

/// A successful DELETE of a pod, in ms relative to a round's scale-down.
#[derive(Clone, Debug, PartialEq)]
pub struct PodDelete {
    pub name: String,
    pub received_ms: f64,
    pub done_ms: f64,
    pub actor: String,
}

/// The successful pod DELETEs of `entries`, relative to `origin_unix_ms`.
pub fn pod_deletes(
    entries: &[Entry],
    controller: Option<&Identity>,
    origin_unix_ms: f64,
) -> Vec<PodDelete> {
    entries
        .iter()
        .filter(|e| e.verb == "delete" && e.resource == "pods" && e.subresource.is_empty())
        .filter(|e| e.ok())
        .map(|e| PodDelete {
            name: e.name.clone(),
            received_ms: e.received_unix_ms - origin_unix_ms,
            done_ms: e.done_unix_ms - origin_unix_ms,
            actor: actor(e, controller),
        })
        .collect()
}

fn count_by<'a>(items: impl Iterator<Item = String> + 'a) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for k in items {
        *out.entry(k).or_insert(0) += 1;
    }
    out
}

/// The phase's numbers from the log: the controller's record patches (refused ones by code), its
/// cleanup pod creates, and every pod DELETE by actor and code, over the phase's `namespaces`.
pub fn phase_json(read: Option<&Slice>, namespaces: &[String]) -> Value {
    let Some(read) = read else {
        return json!({"available": false});
    };
    let controller = identity(&read.entries);
    let records: Vec<&Entry> = read
        .entries
        .iter()
        .filter(|e| e.verb == "patch" && e.resource == "statefulsets" && e.subresource.is_empty())
        .filter(|e| e.has_our_field_manager())
        .collect();
    let failed: Vec<&Entry> = records.iter().copied().filter(|e| !e.ok()).collect();
    let creates: Vec<&Entry> = read
        .entries
        .iter()
        .filter(|e| e.verb == "create" && e.resource == "pods" && e.subresource.is_empty())
        .filter(|e| e.has_our_field_manager())
        .collect();
    let deletes: BTreeMap<String, BTreeMap<String, u64>> = {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for e in read
            .entries
            .iter()
            .filter(|e| e.verb == "delete" && e.resource == "pods" && e.subresource.is_empty())
        {
            *out.entry(actor(e, controller.as_ref()))
                .or_default()
                .entry(e.code.to_string())
                .or_insert(0) += 1;
        }
        out
    };
    json!({
        "available": true,
        "namespace": namespaces.join(","),
        "incomplete": read.incomplete,
        "entries": read.entries.len(),
        "other_namespaces_lines": read.other_lines,
        "controller_identity": controller.map(|c| json!({"user": c.user, "user_agent": c.user_agent})),
        "record_patches": {
            "total": records.len(),
            "failed": failed.len(),
            "failed_by_code": count_by(failed.iter().map(|e| e.code.to_string())),
        },
        "cleanup_pod_creates": {
            "total": creates.len(),
            "by_code": count_by(creates.iter().map(|e| e.code.to_string())),
        },
        "pod_deletes_by_actor_and_code": deletes,
    })
}

/// Checks of the parsing and attribution on made-up lines; the number of checks, or what failed.
pub fn self_test() -> Result<usize, String> {
    let mut checks = 0;
    let mut expect = |ok: bool, what: &str| -> Result<(), String> {
        checks += 1;
        if ok {
            Ok(())
        } else {
            Err(format!("audit: {what}"))
        }
    };
    expect(
        unix_ms("2026-11-25T12:42:35.417187Z")
            .is_some_and(|t| (t - 1_795_610_555_417.187).abs() < 0.01),
        "timestamp with microseconds",
    )?;
    expect(unix_ms("1970-01-01T00:00:00Z") == Some(0.0), "the epoch")?;
    expect(
        unix_ms("2000-02-29T23:59:59.5Z") == Some(951_868_799_500.0),
        "a leap day",
    )?;
    expect(unix_ms("2026-11-25 12:42:35Z").is_none(), "no T, no time")?;
    let line = |verb: &str, uri: &str, name: &str, code: u16, ua: Option<&str>| {
        let resource = if uri.contains("statefulsets") {
            "statefulsets"
        } else {
            "pods"
        };
        let mut v = json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb, "requestURI": uri,
            "user": {"username": "scaledown-e2e-admin"},
            "objectRef": {"resource": resource, "namespace": "ns", "name": name},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": "2026-11-25T12:00:00.100000Z",
            "stageTimestamp": "2026-11-25T12:00:00.105000Z",
        });
        if let Some(ua) = ua {
            v["userAgent"] = json!(ua);
        }
        v.to_string()
    };
    let entries: Vec<Entry> = [
        line(
            "create",
            &format!("/api/v1/namespaces/ns/pods?&fieldManager={FIELD_MANAGER}"),
            "",
            201,
            None,
        ),
        line(
            "patch",
            &format!("/apis/apps/v1/namespaces/ns/statefulsets/s?&fieldManager={FIELD_MANAGER}"),
            "s",
            422,
            None,
        ),
        line(
            "patch",
            "/apis/apps/v1/namespaces/ns/statefulsets/s?",
            "s",
            200,
            None,
        ),
        line("delete", "/api/v1/namespaces/ns/pods/s-1", "s-1", 200, None),
        line(
            "delete",
            "/api/v1/namespaces/ns/pods/s-1",
            "s-1",
            200,
            Some(concat!(
                "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/$Format/",
                "system:serviceaccount:kube-system:statefulset-controller"
            )),
        ),
        line(
            "delete",
            "/api/v1/namespaces/ns/pods/s-1",
            "s-1",
            409,
            Some("kwok/v0.8.0 (linux/amd64)"),
        ),
    ]
    .iter()
    .filter_map(|l| parse(l))
    .collect();
    expect(entries.len() == 6, "six entries parse")?;
    let me = identity(&entries);
    expect(
        me == Some(Identity {
            user: "scaledown-e2e-admin".into(),
            user_agent: String::new(),
        }),
        "the controller is who carries the field manager",
    )?;
    let actors: Vec<String> = entries[3..].iter().map(|e| actor(e, me.as_ref())).collect();
    expect(
        actors
            == [
                CONTROLLER,
                "kube-controller-manager (statefulset-controller)",
                "kwok",
            ],
        &format!("actors {actors:?}"),
    )?;
    let deletes = pod_deletes(&entries, me.as_ref(), 1_795_608_000_000.0);
    expect(
        deletes.len() == 2 && (deletes[0].received_ms - 100.0).abs() < 0.01,
        "only successful deletes, relative to the origin",
    )?;
    let read = Slice {
        entries,
        other_lines: 3,
        incomplete: false,
    };
    let j = phase_json(Some(&read), &["ns".to_string()]);
    expect(
        j["record_patches"]["total"] == json!(1)
            && j["record_patches"]["failed_by_code"]["422"] == json!(1),
        "one refused record (the bench's own patch does not count)",
    )?;
    expect(
        j["pod_deletes_by_actor_and_code"]["kwok"]["409"] == json!(1),
        "deletes by actor and code",
    )?;
    Ok(checks)
}
