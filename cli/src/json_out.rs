//! `--json` output that is more than one `json!` literal (schemas in
//! docs/CLI.md: fields may be added, never renamed or removed).

use std::path::Path;

use serde_json::{json, Value as Json};
use zt::container::verify::{Verification, Violation};

/// Print one JSON document on stdout.
pub fn print(value: &Json) -> zt::Result<()> {
    crate::out::line(format_args!(
        "{}",
        serde_json::to_string_pretty(value).expect("a serde_json::Value always serializes")
    ))
}

/// `zt verify --json` after a successful integrity check; `violations` is
/// `None` without `--canonical`.
pub fn verified(
    file: &Path,
    deep: bool,
    v: &Verification,
    violations: Option<&[Violation]>,
) -> Json {
    json!({
        "file": file.display().to_string(),
        "ok": violations.is_none_or(|x| x.is_empty()),
        "deep": deep,
        "checked": v.checked,
        "undigested": v.undigested,
        "canonical": violations.map(|x| x.is_empty()),
        "violations": violations.unwrap_or_default().iter()
            .map(|x| json!({"rule": x.rule, "detail": x.detail}))
            .collect::<Vec<_>>(),
        "error": null,
        "error_rule": null,
    })
}

/// `zt verify --json` when the file could not be read or failed a check.
pub fn verify_failed(file: &Path, deep: bool, error: &zt::Error) -> Json {
    json!({
        "file": file.display().to_string(),
        "ok": false,
        "deep": deep,
        "checked": null,
        "undigested": null,
        "canonical": null,
        "violations": [],
        "error": error.to_string(),
        // The rule stderr names too (Python's `FormatError.rule`).
        "error_rule": error.rule().map(zt::Rule::name),
    })
}
