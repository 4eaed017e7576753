//! Records the git commit zt is built from as `ZT_GIT_COMMIT`, for
//! `zt --version`. Outside a git checkout of zt (an sdist, a vendored copy)
//! it is "unknown", unless the builder sets `ZT_GIT_COMMIT` itself.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ZT_GIT_COMMIT");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let given = std::env::var("ZT_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    // Only a checkout that tracks this crate names zt's commit: an sdist
    // unpacked inside some other repository must not take that one's.
    let ours = git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"]).is_some();
    let commit = given
        .or_else(|| {
            ours.then(|| git(dir, &["rev-parse", "--short=12", "HEAD"]))
                .flatten()
        })
        .unwrap_or_else(|| "unknown".to_string());
    if ours {
        // Rebuild when HEAD moves: HEAD itself, the branch it names (loose
        // or packed). Only existing files: a missing one would rerun always.
        let mut watch = Vec::new();
        if let Some(git_dir) = git(dir, &["rev-parse", "--absolute-git-dir"]) {
            watch.push(Path::new(&git_dir).join("HEAD"));
        }
        if let (Some(common), Some(branch)) = (
            git(
                dir,
                &["rev-parse", "--path-format=absolute", "--git-common-dir"],
            ),
            git(dir, &["symbolic-ref", "-q", "HEAD"]),
        ) {
            watch.push(Path::new(&common).join(branch));
            watch.push(Path::new(&common).join("packed-refs"));
        }
        for path in watch.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rustc-env=ZT_GIT_COMMIT={commit}");
}
