//! Object URLs: `s3://bucket/key` and `http(s)://host[:port]/path`.

use crate::error::{Error, ErrorKind, Result};

/// Which protocol serves an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// The S3 API (AWS or any S3-compatible server).
    S3,
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
    /// The bucket (S3) or the origin `http(s)://host[:port]` (HTTP).
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
        let (scheme, rest, origin_scheme) = if let Some(rest) = text.strip_prefix("s3://") {
            (Scheme::S3, rest, "")
        } else if let Some(rest) = text.strip_prefix("https://") {
            (Scheme::Http, rest, "https://")
        } else if let Some(rest) = text.strip_prefix("http://") {
            (Scheme::Http, rest, "http://")
        } else {
            return Err(bad("expected s3://, http:// or https://"));
        };
        let (host, key) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad(match scheme {
                Scheme::S3 => "no bucket name",
                Scheme::Http => "no host",
            }));
        }
        if key.split('/').any(|c| c == "..") {
            return Err(bad("a key may not contain `..`"));
        }
        Ok(ObjectUrl {
            text: text.to_string(),
            scheme,
            root: match scheme {
                Scheme::S3 => host.to_string(),
                Scheme::Http => format!("{origin_scheme}{host}"),
            },
            key: key.trim_start_matches('/').to_string(),
        })
    }

    /// The URL of `key` under the same root.
    pub fn with_key(&self, key: &str) -> ObjectUrl {
        let text = match self.scheme {
            Scheme::S3 => format!("s3://{}/{key}", self.root),
            Scheme::Http => format!("{}/{key}", self.root),
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
