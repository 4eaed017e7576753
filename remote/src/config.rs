//! Configuration as users expect it, for each backend:
//!
//! - S3: the standard AWS environment (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//!   `AWS_ENDPOINT_URL[_S3]`, `AWS_ALLOW_HTTP`, ...) and the shared config
//!   and credentials files of `AWS_PROFILE` (which `object_store` does not
//!   read itself);
//! - Google Cloud Storage: `GOOGLE_APPLICATION_CREDENTIALS` (and the other
//!   `GOOGLE_*` variables `object_store` knows: `GOOGLE_SERVICE_ACCOUNT`,
//!   `GOOGLE_SERVICE_ACCOUNT_KEY`, ...), and `STORAGE_EMULATOR_HOST`, the
//!   emulator's address Google's own clients read (requests to it are sent
//!   unsigned, as theirs are);
//! - Azure Blob Storage: `AZURE_STORAGE_CONNECTION_STRING` (which, like the
//!   `connection_string` option, is then the whole configuration, as in
//!   Azure's SDKs), else `AZURE_STORAGE_ACCOUNT_NAME`,
//!   `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_TOKEN`,
//!   `AZURE_STORAGE_ENDPOINT`, `AZURE_STORAGE_USE_EMULATOR` (Azurite at
//!   `AZURITE_BLOB_STORAGE_URL`, default `http://127.0.0.1:10000`) and the
//!   other `AZURE_*` variables `object_store` knows;
//!
//! and explicit storage options, which win.
//!
//! Storage options use `object_store`'s key names (`endpoint`, `region`,
//! `access_key_id`, `secret_access_key`, `session_token`, `allow_http`,
//! `virtual_hosted_style_request`, `skip_signature`, `timeout`; for GCS
//! `service_account`, `service_account_key`, `application_credentials`,
//! `base_url`; for Azure `account_name`, `account_key`, `sas_token`,
//! `use_emulator`, ...), the same names `obstore` takes, plus zt's own:
//! `profile`, `connection_string`, `part_size`, `concurrency`,
//! `coalesce_gap`, `max_amplification`, `inflight_requests`,
//! `inflight_bytes`, `max_retries`, `retry_timeout`, `connect_timeout`,
//! `idle_timeout`, `cache`, `cache_bytes`, `spool`. A key must be one the
//! URL's backend knows; `endpoint` is GCS's `base_url` too. An `http://`
//! endpoint allows plain HTTP.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::gcp::{
    GcpCredential, GoogleCloudStorage, GoogleCloudStorageBuilder, GoogleConfigKey,
};
use object_store::http::HttpBuilder;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig, StaticCredentialProvider,
};

use crate::error::{Error, ErrorKind, Result};
use crate::watch::Connector;

/// Default size of one ranged GET of a large read (a smaller read is split
/// into smaller parts to keep `concurrency` in flight:
/// [`crate::link::Link::read_part`]), and of one uploaded part (AWS's
/// guidance is 8–16 MiB; on the loopback benchmark 16 MiB parts
/// loaded 1 GiB ~10% faster than 8 MiB ones: fewer requests to sign and
/// serve).
pub const DEFAULT_PART_SIZE: u64 = 16 << 20;
/// Default number of requests in flight for one read or upload.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Neighbouring small reads closer than this are fetched as one request
/// until the connection has been measured ([`crate::link`] then sets the
/// gap to what one request's first-byte latency would have downloaded).
pub const DEFAULT_COALESCE_GAP: u64 = 1 << 20;
/// Default bound on read amplification: a coalesced request downloads at
/// most this many times the bytes its reads asked for, so a gather of small
/// records scattered over a large store fetches them one by one rather than
/// the megabytes between them.
pub const DEFAULT_MAX_AMPLIFICATION: u32 = 4;
/// Default budget of requests in flight in the whole process, every read
/// of every object and record store together ([`crate::fetch`]),
/// independent of the CPU count. Requests in flight over the first-byte
/// latency bound the request rate (Little's law): at S3's 50-200 ms first
/// byte, 256 in flight keep 1,300-5,000 small GETs a second moving, up to
/// the 5,500 a second S3 serves per prefix; 64 would cap a gather of small
/// records at a quarter of that.
pub const DEFAULT_INFLIGHT_REQUESTS: usize = 256;
/// Default budget of bytes in flight (the sum of the ranges of the requests
/// in flight): 16 parts of the default size, what the parallel read of one
/// large tensor has in flight.
pub const DEFAULT_INFLIGHT_BYTES: u64 = 256 << 20;
/// Default bound on the local cache directory.
pub const DEFAULT_CACHE_BYTES: u64 = 16 << 30;
/// Default limit on one request, start to last byte.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default idle timeout: a response that sends nothing (its head to a
/// request without a body, or its body's next bytes) for this long is
/// abandoned and retried. S3's first byte comes in 0.1-0.2 s and a
/// transfer that moves no byte for 20 s is stalled, not slow; a sixth of
/// [`DEFAULT_TIMEOUT`], so a stall costs a retry, not the request.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How zt reaches object storage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoteConfig {
    /// Options handed to the store (object_store key names), applied after
    /// the environment and profile files.
    pub store_options: Vec<(String, String)>,
    /// The AWS profile to read from the shared files (`AWS_PROFILE` if unset).
    pub profile: Option<String>,
    /// An Azure Storage connection string (`AZURE_STORAGE_CONNECTION_STRING`
    /// if unset): the whole Azure configuration when given.
    pub connection_string: Option<String>,
    /// Bytes per ranged GET of a large read (the most: a smaller read's
    /// parts are sized for it, [`crate::link::Link::read_part`]), and per
    /// uploaded part.
    pub part_size: u64,
    /// Requests in flight for one read or upload.
    pub concurrency: usize,
    /// Small reads closer than this are coalesced into one request; `None`
    /// (the default) measures it from the connection ([`crate::link`]).
    pub coalesce_gap: Option<u64>,
    /// A coalesced request downloads at most this many times the bytes its
    /// reads asked for; 0 leaves it unbounded (the gap alone decides).
    pub max_amplification: u32,
    /// Requests in flight in the process under this configuration, every
    /// object's together ([`crate::fetch::Budget`]).
    pub inflight_requests: usize,
    /// Bytes in flight (ranges requested and not yet received) under this
    /// configuration, every object's together.
    pub inflight_bytes: u64,
    /// Retries of a failed request (5xx, throttling, timeouts).
    pub max_retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout: Duration,
    /// Limit on one request, start to last byte.
    pub timeout: Duration,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// A response that sends nothing for this long (its head to a request
    /// without a body, or its body's next bytes) is abandoned and retried.
    pub idle_timeout: Duration,
    /// A local cache directory for whole objects (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Bound on the cache directory's size.
    pub cache_bytes: u64,
    /// Where uploads are built before they are sent (the system temp dir
    /// if unset).
    pub spool_dir: Option<PathBuf>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            store_options: Vec::new(),
            profile: None,
            connection_string: None,
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            coalesce_gap: None,
            max_amplification: DEFAULT_MAX_AMPLIFICATION,
            inflight_requests: DEFAULT_INFLIGHT_REQUESTS,
            inflight_bytes: DEFAULT_INFLIGHT_BYTES,
            max_retries: 5,
            retry_timeout: Duration::from_secs(60),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            cache_dir: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
            spool_dir: None,
        }
    }
}

fn parse_number<T: FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::new(ErrorKind::Config, key, format!("{value:?} is not a number")))
}

fn parse_seconds(key: &str, value: &str) -> Result<Duration> {
    let secs: f64 = parse_number(key, value.trim().trim_end_matches('s'))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(Error::new(
            ErrorKind::Config,
            key,
            "must be a positive number of seconds",
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl RemoteConfig {
    /// Read storage options (`key`, `value`) pairs: zt's own keys set the
    /// fields, every other key must be one `object_store` knows.
    pub fn from_options<K: AsRef<str>, V: AsRef<str>>(options: &[(K, V)]) -> Result<RemoteConfig> {
        let mut c = RemoteConfig::default();
        for (key, value) in options {
            let (key, value) = (key.as_ref(), value.as_ref());
            match key {
                "profile" | "aws_profile" => c.profile = Some(value.to_string()),
                "connection_string" | "azure_storage_connection_string" => {
                    c.connection_string = Some(value.to_string())
                }
                "part_size" => c.part_size = parse_number(key, value)?,
                "concurrency" => c.concurrency = parse_number(key, value)?,
                "coalesce_gap" => c.coalesce_gap = Some(parse_number(key, value)?),
                "max_amplification" => c.max_amplification = parse_number(key, value)?,
                "inflight_requests" => c.inflight_requests = parse_number(key, value)?,
                "inflight_bytes" => c.inflight_bytes = parse_number(key, value)?,
                "max_retries" => c.max_retries = parse_number(key, value)?,
                "retry_timeout" => c.retry_timeout = parse_seconds(key, value)?,
                "timeout" => c.timeout = parse_seconds(key, value)?,
                "connect_timeout" => c.connect_timeout = parse_seconds(key, value)?,
                "idle_timeout" => c.idle_timeout = parse_seconds(key, value)?,
                "cache" => c.cache_dir = Some(PathBuf::from(value)),
                "cache_bytes" => c.cache_bytes = parse_number(key, value)?,
                "spool" => c.spool_dir = Some(PathBuf::from(value)),
                other => {
                    // Any backend's key: the URL decides which applies,
                    // and the store refuses one its backend does not know.
                    if AmazonS3ConfigKey::from_str(other).is_err()
                        && GoogleConfigKey::from_str(other).is_err()
                        && AzureConfigKey::from_str(other).is_err()
                    {
                        return Err(Error::new(
                            ErrorKind::Config,
                            other,
                            "unknown storage option",
                        ));
                    }
                    c.store_options.push((other.to_string(), value.to_string()));
                }
            }
        }
        if c.part_size < (64 << 10) || c.part_size > (5 << 30) {
            return Err(Error::new(
                ErrorKind::Config,
                "part_size",
                "must be 64 KiB to 5 GiB",
            ));
        }
        for (key, value) in [
            ("concurrency", c.concurrency as u64),
            ("inflight_requests", c.inflight_requests as u64),
        ] {
            if value == 0 {
                return Err(Error::new(ErrorKind::Config, key, "must be at least 1"));
            }
        }
        if c.inflight_bytes < (64 << 10) {
            return Err(Error::new(
                ErrorKind::Config,
                "inflight_bytes",
                "must be at least 64 KiB",
            ));
        }
        Ok(c)
    }

    /// The same configuration with the `endpoint` option set (the CLI's
    /// `--endpoint`).
    pub fn with_endpoint(mut self, endpoint: &str) -> RemoteConfig {
        self.store_options.retain(|(k, _)| !is_endpoint_key(k));
        self.store_options
            .push(("endpoint".into(), endpoint.into()));
        self
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }

    fn client_settings(&self) -> [(ClientConfigKey, String); 2] {
        [
            (
                ClientConfigKey::Timeout,
                format!("{}ms", self.timeout.as_millis()),
            ),
            (
                ClientConfigKey::ConnectTimeout,
                format!("{}ms", self.connect_timeout.as_millis()),
            ),
        ]
    }

    /// The HTTP client every store sends its requests through: object_store's
    /// own, watched for stalls ([`crate::watch`]).
    fn connector(&self) -> Connector {
        Connector {
            idle: self.idle_timeout,
        }
    }

    /// Build the S3 store for `bucket`.
    pub(crate) fn s3_store(&self, bucket: &str) -> Result<AmazonS3> {
        let mut b = AmazonS3Builder::new().with_http_connector(self.connector());
        for (key, value) in self.client_settings() {
            b = b.with_config(AmazonS3ConfigKey::Client(key), value);
        }
        let env_profile = std::env::var("AWS_PROFILE").ok();
        if self.profile.is_none() {
            // The shared files come first so the environment can override
            // them; a missing file or profile is not an error here.
            let profile = env_profile.as_deref().unwrap_or("default");
            b = apply_profile(b, profile, false)?;
        }
        for (key, value) in std::env::vars() {
            if let Some(name) = key.strip_prefix("AWS_") {
                if name == "PROFILE" {
                    continue;
                }
                if let Ok(k) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                    b = b.with_config(k, value);
                }
            }
        }
        if let Some(profile) = &self.profile {
            // An explicitly chosen profile must exist, and beats the
            // environment (as `aws --profile` does).
            b = apply_profile(b, profile, true)?;
        }
        for (key, value) in &self.store_options {
            let k = key
                .parse::<AmazonS3ConfigKey>()
                .map_err(|_| unknown_for(key, "S3"))?;
            b = b.with_config(k, value);
        }
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
        // The builder reports allow_http as "false" when nobody set it, so
        // ask whether the environment or the options said anything.
        let allow_http_said = std::env::var_os("AWS_ALLOW_HTTP").is_some()
            || self.store_options.iter().any(|(k, _)| {
                k.parse::<AmazonS3ConfigKey>().ok()
                    == Some(AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            });
        let plain = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        if plain && !allow_http_said {
            // An endpoint that says http:// means plain HTTP.
            b = b.with_allow_http(true);
        }
        if b.get_config_value(&AmazonS3ConfigKey::Region).is_none() {
            b = b.with_region("us-east-1");
        }
        let store = b
            .with_bucket_name(bucket)
            .with_retry(self.retry())
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, format!("s3://{bucket}"), e.to_string()))?;
        Ok(store)
    }

    /// Build the Google Cloud Storage store for `bucket`: the `GOOGLE_*`
    /// environment (`GOOGLE_APPLICATION_CREDENTIALS`, ...), then
    /// `STORAGE_EMULATOR_HOST` (an emulator's address: requests to it go
    /// unsigned), then the options.
    pub(crate) fn gcs_store(&self, bucket: &str) -> Result<GoogleCloudStorage> {
        let url = format!("gs://{bucket}");
        let mut b = GoogleCloudStorageBuilder::from_env().with_http_connector(self.connector());
        for (key, value) in self.client_settings() {
            b = b.with_config(GoogleConfigKey::Client(key), value);
        }
        let emulator = std::env::var("STORAGE_EMULATOR_HOST")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .map(|h| {
                let h = h.trim().trim_end_matches('/');
                if h.contains("://") {
                    h.to_string()
                } else {
                    format!("http://{h}")
                }
            });
        if let Some(base) = &emulator {
            b = b
                .with_base_url(base)
                .with_config(GoogleConfigKey::SkipSignature, "true");
        }
        let mut allow_http_said = false;
        for (key, value) in &self.store_options {
            let k = if is_endpoint_key(key) {
                GoogleConfigKey::BaseUrl
            } else {
                key.parse::<GoogleConfigKey>()
                    .map_err(|_| unknown_for(key, "Google Cloud Storage"))?
            };
            allow_http_said |= k == GoogleConfigKey::Client(ClientConfigKey::AllowHttp);
            b = b.with_config(k, value);
        }
        if b.get_config_value(&GoogleConfigKey::SkipSignature)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            // object_store skips the token for reads but still asks for one
            // on uploads, from the instance metadata server when nothing
            // else is configured: an empty static token keeps an unsigned
            // store (an emulator, a public bucket) from ever calling it.
            b = b.with_credentials(Arc::new(StaticCredentialProvider::new(GcpCredential {
                bearer: String::new(),
            })));
        }
        let plain = b
            .get_config_value(&GoogleConfigKey::BaseUrl)
            .is_some_and(|u| u.starts_with("http://"));
        if plain && !allow_http_said {
            b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
        b.with_bucket_name(bucket)
            .with_retry(self.retry())
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, url, e.to_string()))
    }

    /// Build the Azure Blob Storage store for `container`: a connection
    /// string (the `connection_string` option, else
    /// `AZURE_STORAGE_CONNECTION_STRING`) is the whole configuration, as in
    /// Azure's SDKs; without one the `AZURE_*` environment
    /// (`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`,
    /// `AZURE_STORAGE_USE_EMULATOR`, ...). The options come last.
    pub(crate) fn azure_store(&self, container: &str) -> Result<MicrosoftAzure> {
        let url = format!("az://{container}");
        let connection = self.connection_string.clone().or_else(|| {
            std::env::var("AZURE_STORAGE_CONNECTION_STRING")
                .ok()
                .filter(|s| !s.trim().is_empty())
        });
        let mut b = match &connection {
            Some(text) => {
                let mut b = MicrosoftAzureBuilder::new();
                for (k, v) in parse_connection_string(text)
                    .map_err(|why| Error::new(ErrorKind::Config, "connection_string", why))?
                {
                    b = b.with_config(k, v);
                }
                b
            }
            None => MicrosoftAzureBuilder::from_env(),
        };
        for (key, value) in self.client_settings() {
            b = b.with_config(AzureConfigKey::Client(key), value);
        }
        let mut allow_http_said = false;
        for (key, value) in &self.store_options {
            let k = key
                .parse::<AzureConfigKey>()
                .map_err(|_| unknown_for(key, "Azure Blob Storage"))?;
            allow_http_said |= k == AzureConfigKey::Client(ClientConfigKey::AllowHttp);
            b = b.with_config(k, value);
        }
        let plain = b
            .get_config_value(&AzureConfigKey::Endpoint)
            .is_some_and(|u| u.starts_with("http://"));
        if plain && !allow_http_said && std::env::var_os("AZURE_ALLOW_HTTP").is_none() {
            b = b.with_config(AzureConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
        b.with_container_name(container)
            .with_http_connector(self.connector())
            .with_retry(self.retry())
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, url, e.to_string()))
    }

    /// Build the HTTP store for `origin` (`http(s)://host[:port]`).
    pub(crate) fn http_store(&self, origin: &str) -> Result<Arc<dyn ObjectStore>> {
        let mut b = HttpBuilder::new()
            .with_url(origin)
            .with_retry(self.retry())
            .with_http_connector(self.connector());
        for (key, value) in self.client_settings() {
            b = b.with_config(key, value);
        }
        if origin.starts_with("http://") {
            b = b.with_config(ClientConfigKey::AllowHttp, "true");
        }
        for (key, value) in &self.store_options {
            // S3-only keys (credentials, region) do not apply to plain HTTP.
            if let Ok(k) = key.parse::<ClientConfigKey>() {
                b = b.with_config(k, value);
            }
        }
        let store = b
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, origin, e.to_string()))?;
        Ok(Arc::new(store))
    }
}

/// True for any backend's name of the endpoint option (`endpoint`,
/// `aws_endpoint_url`, `azure_storage_endpoint`, ...).
fn is_endpoint_key(key: &str) -> bool {
    key.parse::<AmazonS3ConfigKey>().ok() == Some(AmazonS3ConfigKey::Endpoint)
        || key.parse::<AzureConfigKey>().ok() == Some(AzureConfigKey::Endpoint)
}

fn unknown_for(key: &str, backend: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        key,
        format!("unknown storage option for {backend}"),
    )
}

/// The settings of an Azure Storage connection string
/// (`Key=Value;Key=Value`): `AccountName`, `AccountKey`,
/// `SharedAccessSignature`, `BlobEndpoint` (else
/// `DefaultEndpointsProtocol` and `EndpointSuffix` make one), and
/// `UseDevelopmentStorage=true` (Azurite). Other services' endpoints are
/// ignored.
pub fn parse_connection_string(
    text: &str,
) -> std::result::Result<Vec<(AzureConfigKey, String)>, String> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for item in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not Key=Value"))?;
        fields.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let get = |name: &str| {
        fields
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut out = Vec::new();
    if get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        out.push((AzureConfigKey::UseEmulator, "true".to_string()));
    }
    let account = get("accountname");
    if let Some(name) = &account {
        out.push((AzureConfigKey::AccountName, name.clone()));
    }
    if let Some(key) = get("accountkey") {
        out.push((AzureConfigKey::AccessKey, key));
    }
    if let Some(sas) = get("sharedaccesssignature") {
        out.push((AzureConfigKey::SasKey, sas));
    }
    let endpoint = get("blobendpoint").or_else(|| {
        let suffix = get("endpointsuffix")?;
        let protocol = get("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
        Some(format!(
            "{protocol}://{}.blob.{suffix}",
            account.as_deref()?
        ))
    });
    if let Some(endpoint) = endpoint {
        out.push((AzureConfigKey::Endpoint, endpoint));
    }
    if out.is_empty() {
        return Err("names no account, key, endpoint or development storage".into());
    }
    Ok(out)
}

/// The shared config and credentials files (`AWS_CONFIG_FILE`,
/// `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/config`, `~/.aws/credentials`).
fn shared_files() -> [Option<PathBuf>; 2] {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let pick = |var: &str, name: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    [
        pick("AWS_CONFIG_FILE", "config"),
        pick("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
    ]
}

/// The `key = value` pairs of section `profile` of an INI file: `[name]` in
/// the credentials file, `[profile name]` (or `[default]`) in the config
/// file. Nested `s3 =` blocks (indented lines) are skipped.
pub fn profile_section(
    text: &str,
    profile: &str,
    config_file: bool,
) -> Option<Vec<(String, String)>> {
    let wanted = if config_file && profile != "default" {
        format!("profile {profile}")
    } else {
        profile.to_string()
    };
    let mut found = None;
    let mut current: Option<bool> = None;
    for raw in text.lines() {
        if raw.starts_with([' ', '\t']) {
            continue; // a nested sub-section's line
        }
        let line = raw.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let here = name.trim() == wanted;
            current = Some(here);
            if here && found.is_none() {
                found = Some(Vec::new());
            }
            continue;
        }
        if current == Some(true) {
            if let (Some(pairs), Some((k, v))) = (found.as_mut(), line.split_once('=')) {
                let pairs: &mut Vec<(String, String)> = pairs;
                pairs.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    found
}

fn apply_profile(mut b: AmazonS3Builder, profile: &str, required: bool) -> Result<AmazonS3Builder> {
    let mut seen = false;
    for (i, file) in shared_files().iter().enumerate() {
        let Some(file) = file else { continue };
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(file.display(), e)),
        };
        let Some(pairs) = profile_section(&text, profile, i == 0) else {
            continue;
        };
        seen = true;
        for (k, v) in pairs {
            let key = match k.as_str() {
                "aws_access_key_id" => AmazonS3ConfigKey::AccessKeyId,
                "aws_secret_access_key" => AmazonS3ConfigKey::SecretAccessKey,
                "aws_session_token" => AmazonS3ConfigKey::Token,
                "region" => AmazonS3ConfigKey::Region,
                "endpoint_url" => AmazonS3ConfigKey::Endpoint,
                _ => continue,
            };
            b = b.with_config(key, v);
        }
    }
    if required && !seen {
        return Err(Error::new(
            ErrorKind::Config,
            format!("profile {profile}"),
            "not found in the shared config or credentials file",
        ));
    }
    Ok(b)
}

/// The directory uploads are built in.
pub fn spool_dir(config: &RemoteConfig) -> PathBuf {
    config.spool_dir.clone().unwrap_or_else(std::env::temp_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn options_split_into_zt_and_store_keys() {
        let c = RemoteConfig::from_options(&[
            ("endpoint", "http://127.0.0.1:8333"),
            ("part_size", "16777216"),
            ("concurrency", "32"),
            ("timeout", "5s"),
            ("idle_timeout", "0.25"),
            ("cache", "/var/cache/zt"),
            ("coalesce_gap", "0"),
            ("max_amplification", "0"),
            ("inflight_requests", "256"),
            ("inflight_bytes", "1048576"),
        ])
        .unwrap();
        assert_eq!(c.coalesce_gap, Some(0));
        assert_eq!(c.max_amplification, 0);
        assert_eq!(c.inflight_requests, 256);
        assert_eq!(c.inflight_bytes, 1 << 20);
        let d = RemoteConfig::default();
        assert_eq!(d.coalesce_gap, None);
        assert_eq!(d.max_amplification, DEFAULT_MAX_AMPLIFICATION);
        assert_eq!(c.part_size, 16 << 20);
        assert_eq!(c.concurrency, 32);
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.idle_timeout, Duration::from_millis(250));
        assert_eq!(c.cache_dir.as_deref(), Some(Path::new("/var/cache/zt")));
        assert_eq!(
            c.store_options,
            [("endpoint".to_string(), "http://127.0.0.1:8333".to_string())]
        );
        for bad in [
            [("no_such_option", "1")],
            [("part_size", "lots")],
            [("concurrency", "0")],
            [("part_size", "10")],
            [("inflight_requests", "0")],
            [("inflight_bytes", "1000")],
            [("max_amplification", "-1")],
        ] {
            assert_eq!(
                RemoteConfig::from_options(&bad).unwrap_err().kind,
                ErrorKind::Config
            );
        }
    }

    #[test]
    fn every_backends_keys_are_options() {
        let c = RemoteConfig::from_options(&[
            ("service_account", "/k.json"),
            ("account_name", "devstoreaccount1"),
            ("connection_string", "UseDevelopmentStorage=true"),
        ])
        .unwrap();
        assert_eq!(c.store_options.len(), 2);
        assert_eq!(
            c.connection_string.as_deref(),
            Some("UseDevelopmentStorage=true")
        );
        // A key of another backend is refused when the store is built.
        let e = c.s3_store("b").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Config);
        let e = c.gcs_store("b").unwrap_err();
        assert!(e.to_string().contains("Google Cloud Storage"), "{e}");
    }

    #[test]
    fn connection_strings() {
        let azurite = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
            AccountKey=a2V5==;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;\
            QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;";
        assert_eq!(
            parse_connection_string(azurite).unwrap(),
            [
                (AzureConfigKey::AccountName, "devstoreaccount1".into()),
                (AzureConfigKey::AccessKey, "a2V5==".into()),
                (
                    AzureConfigKey::Endpoint,
                    "http://127.0.0.1:10000/devstoreaccount1".into()
                ),
            ]
        );
        assert_eq!(
            parse_connection_string(
                "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=k;EndpointSuffix=core.windows.net"
            )
            .unwrap()[2],
            (
                AzureConfigKey::Endpoint,
                "https://acct.blob.core.windows.net".into()
            )
        );
        assert_eq!(
            parse_connection_string("UseDevelopmentStorage=true").unwrap(),
            [(AzureConfigKey::UseEmulator, "true".into())]
        );
        assert!(parse_connection_string("nonsense").is_err());
        assert!(parse_connection_string("QueueEndpoint=x").is_err());
    }

    #[test]
    fn profile_sections_of_both_files() {
        let credentials = "[default]\naws_access_key_id = A\n[dev]\naws_access_key_id=B\naws_secret_access_key = S\n";
        let config = "[default]\nregion = eu-west-1\n[profile dev]\nregion = us-west-2\ns3 =\n  addressing_style = path\nendpoint_url = http://x:1\n";
        assert_eq!(
            profile_section(credentials, "dev", false).unwrap(),
            [
                ("aws_access_key_id".into(), "B".into()),
                ("aws_secret_access_key".into(), "S".into())
            ]
        );
        assert_eq!(
            profile_section(config, "dev", true).unwrap(),
            [
                ("region".into(), "us-west-2".into()),
                ("s3".into(), "".into()),
                ("endpoint_url".into(), "http://x:1".into())
            ]
        );
        assert_eq!(
            profile_section(config, "default", true).unwrap(),
            [("region".into(), "eu-west-1".into())]
        );
        assert!(profile_section(config, "missing", true).is_none());
    }
}
