//! `--endpoint`: one address for every object-storage URL of the command,
//! set through the variables each backend's users already set, so every
//! open, related file and upload of the process reads it (set before any
//! thread starts):
//!
//! - `s3://`: `AWS_ENDPOINT_URL`;
//! - `gs://`: `GOOGLE_BASE_URL`, requests signed as usual; with
//!   `STORAGE_EMULATOR_HOST` set (an emulator, requests unsigned as
//!   Google's clients send them) that variable instead, so the endpoint
//!   replaces the emulator's address and stays unsigned;
//! - `az://`: `AZURE_STORAGE_ENDPOINT` (the account's blob endpoint); with
//!   `AZURE_STORAGE_CONNECTION_STRING` set, which is the whole configuration
//!   as in Azure's SDKs, a `BlobEndpoint` appended to it (its last key wins).
//!
//! A command mixing two services (`zt convert s3://... az://...`) points
//! each at its own endpoint with those variables instead.

/// The variables `--endpoint ENDPOINT` sets, given the environment `get`
/// reads (pure, so the choice is tested without touching the process's).
pub fn variables(
    endpoint: &str,
    get: impl Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String)> {
    let set = |name: &str| get(name).is_some_and(|v| !v.trim().is_empty());
    let mut out = vec![("AWS_ENDPOINT_URL", endpoint.to_string())];
    if set("STORAGE_EMULATOR_HOST") {
        out.push(("STORAGE_EMULATOR_HOST", endpoint.to_string()));
    } else {
        out.push(("GOOGLE_BASE_URL", endpoint.to_string()));
    }
    match get("AZURE_STORAGE_CONNECTION_STRING").filter(|s| !s.trim().is_empty()) {
        Some(text) => out.push((
            "AZURE_STORAGE_CONNECTION_STRING",
            format!(
                "{};BlobEndpoint={endpoint}",
                text.trim().trim_end_matches(';')
            ),
        )),
        None => out.push(("AZURE_STORAGE_ENDPOINT", endpoint.to_string())),
    }
    out
}

/// Set [`variables`] in this process's environment. Called before any
/// thread starts.
pub fn apply(endpoint: &str) {
    for (name, value) in variables(endpoint, |n| std::env::var(n).ok()) {
        std::env::set_var(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(env: &[(&str, &str)]) -> Vec<(&'static str, String)> {
        variables("http://127.0.0.1:9", |n| {
            env.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn every_scheme_gets_the_endpoint_its_users_set() {
        let e = "http://127.0.0.1:9".to_string();
        assert_eq!(
            with(&[]),
            [
                ("AWS_ENDPOINT_URL", e.clone()),
                ("GOOGLE_BASE_URL", e.clone()),
                ("AZURE_STORAGE_ENDPOINT", e.clone()),
            ]
        );
    }

    #[test]
    fn an_emulator_or_a_connection_string_keeps_its_own_form() {
        let got = with(&[
            ("STORAGE_EMULATOR_HOST", "127.0.0.1:4443"),
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountName=a;AccountKey=k;",
            ),
        ]);
        assert_eq!(
            got[1],
            ("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9".into())
        );
        assert_eq!(
            got[2],
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountName=a;AccountKey=k;BlobEndpoint=http://127.0.0.1:9".into()
            )
        );
        // Blank variables are unset ones.
        assert_eq!(
            with(&[("STORAGE_EMULATOR_HOST", " ")])[1].0,
            "GOOGLE_BASE_URL"
        );
    }
}
