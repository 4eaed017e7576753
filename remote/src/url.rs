//! Object URLs: `s3://bucket/key`, `gs://bucket/key` (also `gcs://`),
//! `az://container/key` (also `abfs://` and `abfss://`, as fsspec spells
//! it) and `http(s)://host[:port]/path`.

use crate::error::{Error, ErrorKind, Result};

/// Which protocol serves an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// The S3 API (AWS or any S3-compatible server).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`az://`, `abfs://`).
    Azure,
    /// Plain HTTP(S) with range requests.
    Http,
}

/// A parsed object URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    /// The URL as given.
    pub text: String,
    /// Protocol.
    pub scheme: Scheme,
    /// The bucket (S3, GCS), the container (Azure) or the origin
    /// `http(s)://host[:port]` (HTTP).
    pub root: String,
    /// The object's key (or path) under `root`, without a leading `/`;
    /// empty for a bucket or origin itself.
    pub key: String,
}

impl ObjectUrl {
    /// Parse `text`; `Config` errors name what is wrong.
    pub fn parse(text: &str) -> Result<ObjectUrl> {
        let bad = |why: &str| Error::new(ErrorKind::Config, text, why);
        if text.contains(['?', '#']) {
            return Err(bad(
                "URLs with a query string or fragment are not supported",
            ));
        }
        const PREFIXES: &[(&str, Scheme)] = &[
            ("s3://", Scheme::S3),
            ("gs://", Scheme::Gcs),
            ("gcs://", Scheme::Gcs),
            ("az://", Scheme::Azure),
            ("abfs://", Scheme::Azure),
            ("abfss://", Scheme::Azure),
            ("https://", Scheme::Http),
            ("http://", Scheme::Http),
        ];
        let Some((prefix, scheme, rest)) = PREFIXES
            .iter()
            .find_map(|&(p, s)| text.strip_prefix(p).map(|rest| (p, s, rest)))
        else {
            return Err(bad(
                "expected s3://, gs://, az:// (or abfs://), http:// or https://",
            ));
        };
        let (host, key) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad(match scheme {
                Scheme::S3 | Scheme::Gcs => "no bucket name",
                Scheme::Azure => "no container name",
                Scheme::Http => "no host",
            }));
        }
        if scheme == Scheme::Azure && host.contains('@') {
            // `abfs://container@account.dfs.core.windows.net/key`: the
            // account comes from the configuration here, not the URL.
            return Err(bad(
                "name the container alone (az://container/key) and the account \
                 by AZURE_STORAGE_ACCOUNT_NAME or the account_name option",
            ));
        }
        if key.split('/').any(|c| c == "..") {
            return Err(bad("a key may not contain `..`"));
        }
        Ok(ObjectUrl {
            text: text.to_string(),
            scheme,
            root: match scheme {
                Scheme::Http => format!("{prefix}{host}"),
                _ => host.to_string(),
            },
            key: key.trim_start_matches('/').to_string(),
        })
    }

    /// The URL of `key` under the same root.
    pub fn with_key(&self, key: &str) -> ObjectUrl {
        let text = match self.scheme {
            Scheme::Http => format!("{}/{key}", self.root),
            // The scheme as the URL spelled it (`az://` or `abfs://`).
            _ => {
                let scheme = self.text.find("://").map_or("", |i| &self.text[..i + 3]);
                format!("{scheme}{}/{key}", self.root)
            }
        };
        ObjectUrl {
            text,
            scheme: self.scheme,
            root: self.root.clone(),
            key: key.to_string(),
        }
    }

    /// The store path of the key.
    pub fn path(&self) -> object_store::path::Path {
        object_store::path::Path::from(self.key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_and_http() {
        let u = ObjectUrl::parse("s3://bucket/dir/model.safetensors").unwrap();
        assert_eq!(
            (u.scheme, u.root.as_str(), u.key.as_str()),
            (Scheme::S3, "bucket", "dir/model.safetensors")
        );
        let u = ObjectUrl::parse("https://host:8080/a/b.zt").unwrap();
        assert_eq!(
            (u.scheme, u.root.as_str(), u.key.as_str()),
            (Scheme::Http, "https://host:8080", "a/b.zt")
        );
        assert_eq!(ObjectUrl::parse("s3://bucket").unwrap().key, "");
        assert_eq!(u.with_key("a/c.zt").text, "https://host:8080/a/c.zt");
    }

    #[test]
    fn parses_gcs_and_azure() {
        for (text, scheme, root) in [
            ("gs://b/d/m.safetensors", Scheme::Gcs, "b"),
            ("gcs://b/d/m.safetensors", Scheme::Gcs, "b"),
            ("az://c/d/m.safetensors", Scheme::Azure, "c"),
            ("abfs://c/d/m.safetensors", Scheme::Azure, "c"),
            ("abfss://c/d/m.safetensors", Scheme::Azure, "c"),
        ] {
            let u = ObjectUrl::parse(text).unwrap();
            assert_eq!(
                (u.scheme, u.root.as_str(), u.key.as_str()),
                (scheme, root, "d/m.safetensors"),
                "{text}"
            );
            // A sibling keeps the scheme as spelled.
            let prefix = &text[..text.find("://").unwrap() + 3];
            assert_eq!(
                u.with_key("d/x.bin").text,
                format!("{prefix}{root}/d/x.bin")
            );
        }
        for bad in ["gs://", "az:///k", "abfs://c@acct.dfs.core.windows.net/k"] {
            assert_eq!(
                ObjectUrl::parse(bad).unwrap_err().kind,
                ErrorKind::Config,
                "{bad}"
            );
        }
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        for bad in [
            "s3://",
            "s3:///key",
            "ftp://h/k",
            "https://h/k?x=1",
            "s3://b/../k",
            "/local/path",
        ] {
            let e = ObjectUrl::parse(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Config, "{bad}");
        }
    }
}
