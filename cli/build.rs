//! Records the git commit zt is built from as `ZT_GIT_COMMIT`, for
//! `zt --version`: 12 hex digits, with `-dirty` when the Rust sources it
//! is built from differ from that commit (a build of uncommitted changes
//! must not pass for the commit). Outside a git checkout of zt (an sdist, a vendored copy) it is
//! "unknown", unless the builder sets `ZT_GIT_COMMIT` itself.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    out.status.success().then_some(text)
}

/// The sources the CLI (and the Python extension, which embeds it) is
/// built from, relative to the workspace root: what "dirty" looks at.
const SOURCES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "cli/src",
    "cli/build.rs",
    "cli/Cargo.toml",
    "core/src",
    "core/Cargo.toml",
    "container/src",
    "container/Cargo.toml",
    "formats/src",
    "formats/Cargo.toml",
    "zt/src",
    "zt/Cargo.toml",
    "remote/src",
    "remote/Cargo.toml",
    "fsutil/src",
    "fsutil/Cargo.toml",
    "python/src",
    "python/Cargo.toml",
];

/// The files whose change can change the answer, for `rerun-if-changed`:
/// HEAD, the branch it names (loose or packed), the index (staging or
/// committing), and [`SOURCES`] (an edit makes the tree dirty without
/// touching the index). Only existing paths: a missing one would rerun the
/// script on every build. No build output lies under them (the target
/// directory and the Python package's built extension are elsewhere), so a
/// plain rebuild does not rerun it.
fn watched(dir: &Path, root: &Path) -> Vec<PathBuf> {
    let mut watch = Vec::new();
    if let Some(git_dir) = git(dir, &["rev-parse", "--absolute-git-dir"]) {
        watch.push(Path::new(&git_dir).join("HEAD"));
    }
    if let Some(index) = git(
        dir,
        &["rev-parse", "--path-format=absolute", "--git-path", "index"],
    ) {
        watch.push(PathBuf::from(index));
    }
    if let (Some(common), Some(branch)) = (
        git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        ),
        git(dir, &["symbolic-ref", "-q", "HEAD"]).filter(|b| !b.is_empty()),
    ) {
        watch.push(Path::new(&common).join(branch));
        watch.push(Path::new(&common).join("packed-refs"));
    }
    watch.extend(SOURCES.iter().map(|s| root.join(s)));
    watch.retain(|p| !p.as_os_str().is_empty() && p.exists());
    watch
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ZT_GIT_COMMIT");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = dir.parent().unwrap_or(dir);
    let given = std::env::var("ZT_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    // Only a checkout that tracks this crate names zt's commit: an sdist
    // unpacked inside some other repository must not take that one's.
    let ours =
        given.is_none() && git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"]).is_some();
    let head = ours
        .then(|| git(dir, &["rev-parse", "--short=12", "HEAD"]))
        .flatten()
        .filter(|h| !h.is_empty());
    let builder_named = given.is_some();
    let commit = match (given, head) {
        (Some(c), _) => c,
        (None, Some(head)) => {
            // `git status` refreshes stale stat data first, so a touched
            // but unchanged file does not count; untracked files do not.
            let mut args = vec!["status", "--porcelain", "--untracked-files=no", "--"];
            args.extend(SOURCES);
            let dirty = git(root, &args).is_none_or(|s| !s.is_empty());
            if dirty {
                format!("{head}-dirty")
            } else {
                head
            }
        }
        (None, None) => "unknown".to_string(),
    };
    if ours {
        for path in watched(dir, root) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    } else if !builder_named {
        // git failed here, or this is no checkout of zt. A failure that
        // passes (a git run while another rewrote the index) must not
        // leave "unknown" for good: where a checkout's HEAD and index
        // exist, found without git, a commit or a staging reruns the
        // script. An sdist has neither and stays "unknown".
        for path in [root.join(".git/HEAD"), root.join(".git/index")] {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!("cargo:rustc-env=ZT_GIT_COMMIT={commit}");
    // For the test that checks "-dirty" against `git status`.
    println!("cargo:rustc-env=ZT_GIT_SOURCES={}", SOURCES.join(" "));
}
