//! The plugin's kubeconfig: a `KUBECONFIG` list merged as kubectl merges it.

use std::ffi::OsString;
use std::path::Path;

use super::*;

/// A kubeconfig with one cluster, user and context named `name`, the cluster at `server`.
fn kubeconfig(name: &str, server: &str, namespace: &str, current: bool) -> String {
    let current = if current {
        format!("current-context: {name}\n")
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: Config\n{current}clusters:\n- name: {name}\n  cluster: {{server: \"{server}\"}}\n\
         users:\n- name: {name}\n  user: {{token: t-{name}}}\n\
         contexts:\n- name: {name}\n  context: {{cluster: {name}, user: {name}, namespace: {namespace}}}\n"
    )
}

fn write(dir: &Path, file: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

fn list(paths: &[&Path]) -> OsString {
    std::env::join_paths(paths).expect("a KUBECONFIG list")
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("scaledown-plugin-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[tokio::test]
async fn a_kubeconfig_list_is_merged_first_file_wins_and_missing_files_are_skipped() {
    let dir = temp_dir("merge");
    // The first file names no current context; the second does, and also a `dev` that the first
    // file already defines (the first one's wins, as in kubectl).
    let a = write(
        &dir,
        "a",
        &kubeconfig("dev", "https://127.0.0.1:1", "dev-ns", false),
    );
    let b = write(
        &dir,
        "b",
        &(kubeconfig("prod", "https://127.0.0.1:2", "prod-ns", true).replace(
            "contexts:\n",
            "contexts:\n- name: dev\n  context: {cluster: prod, user: prod, namespace: other}\n",
        )),
    );
    let missing = dir.join("does-not-exist");
    let merged = merged_kubeconfig(&list(&[&a, &missing, &b]))
        .expect("merged")
        .expect("some kubeconfig");
    assert_eq!(merged.current_context.as_deref(), Some("prod"));
    let contexts: Vec<&str> = merged.contexts.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(contexts, ["dev", "prod"], "one dev, the first file's");
    let dev = merged.contexts[0].context.as_ref().expect("dev context");
    assert_eq!(dev.namespace.as_deref(), Some("dev-ns"));

    // The client follows the merged file: the current context of the second file, the cluster and
    // namespace it names; --context picks the first file's.
    let config = Config::from_custom_kubeconfig(merged.clone(), &KubeConfigOptions::default())
        .await
        .expect("config");
    assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:2/");
    assert_eq!(config.default_namespace, "prod-ns");
    let options = KubeConfigOptions {
        context: Some("dev".into()),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(merged, &options)
        .await
        .expect("config");
    assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:1/");
    assert_eq!(config.default_namespace, "dev-ns");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_empty_list_means_the_default_and_a_list_of_missing_files_is_an_error() {
    assert!(
        merged_kubeconfig(&OsString::from(""))
            .expect("empty")
            .is_none()
    );
    assert!(
        merged_kubeconfig(&list(&[Path::new(""), Path::new("")]))
            .expect("empty")
            .is_none()
    );
    let dir = temp_dir("missing");
    let err =
        merged_kubeconfig(&list(&[&dir.join("x"), &dir.join("y")])).expect_err("no file exists");
    assert!(
        err.to_string().contains("names no file that exists"),
        "{err}"
    );
    let bad = write(&dir, "bad", "clusters: [");
    let err = merged_kubeconfig(&list(&[&bad])).expect_err("not YAML");
    assert!(
        err.to_string().contains(&bad.display().to_string()),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kubeconfig_flag_is_not_taken_from_the_environment() {
    // A KUBECONFIG list must not be parsed as one path by clap: the flag has no env fallback.
    let args =
        PluginArgs::try_parse_from(["kubectl-scaledown", "status", "--no-headers", "-o", "yaml"])
            .expect("args");
    assert!(args.kubeconfig.is_none());
    match args.command {
        Command::Status {
            output, no_headers, ..
        } => assert!(output == Output::Yaml && no_headers),
        other => panic!("{other:?}"),
    }
}
