//! Puts the commit the binary is built from into `SCALEDOWN_GIT_COMMIT`, for `--version`:
//! the environment variable of that name if set (hack/image.sh, the Dockerfile), else
//! `git rev-parse HEAD`, else "unknown" (a source tarball without git). Which of the three it was
//! goes into `SCALEDOWN_GIT_COMMIT_SOURCE` ("env", "git" or "none"), so a test can check the value.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SCALEDOWN_GIT_COMMIT");
    let (commit, source) = match std::env::var("SCALEDOWN_GIT_COMMIT") {
        Ok(c) if !c.is_empty() => (c, "env"),
        _ => {
            // Rebuild when HEAD moves: HEAD itself (a branch switch) and the branch's ref file.
            for path in [
                Some("HEAD".to_string()),
                git(&["symbolic-ref", "-q", "HEAD"]),
            ]
            .into_iter()
            .flatten()
            {
                if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
                    let file = PathBuf::from(file);
                    if file.exists() {
                        println!("cargo:rerun-if-changed={}", file.display());
                    }
                }
            }
            if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"])
                && PathBuf::from(&packed).exists()
            {
                println!("cargo:rerun-if-changed={packed}");
            }
            match git(&["rev-parse", "HEAD"]) {
                Some(head) => (head, "git"),
                None => ("unknown".to_string(), "none"),
            }
        }
    };
    println!("cargo:rustc-env=SCALEDOWN_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SCALEDOWN_GIT_COMMIT_SOURCE={source}");
}
