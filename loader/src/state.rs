//! The resumable state of a run: where it is and the settings that decide
//! its global stream, never a rank's position.
//!
//! A [`State`] records the next global step, the global batch size, the
//! length, the mode, the seed and `samples_seen` (the global step times the
//! global batch). Since every batch is a pure function of those settings and
//! the step, resuming on any world size that divides the global batch
//! continues the same global stream ([`State::resume_step`]). A state saved
//! with other settings is refused unless the caller re-bases it, which
//! starts the new settings' own stream at the first step past
//! `samples_seen`.
//!
//! Saved form (what Python's `state_dict()` returns, and [`State::to_json`]
//! writes): `{"version": 2, "global_step", "global_batch_size", "length",
//! "mode", "seed", "samples_seen"}`, all integers, and two keys only the
//! loaders that need them write (so every other state is as before):
//! `"block_size"` for BLOCK_SHUFFLE, and `"mix"`, a digest of a mixture's
//! weights and record counts ([`crate::Mix::fingerprint`]), for a loader
//! over a mixture; a state without them was saved by a loader without
//! them. The first form (version 1,
//! or no version: `{"step", "length", "batch_size", "mode", "seed"}`) still
//! loads. [`State::from_entries`] reads either from key/value pairs (what the
//! Python binding hands over from a dict), [`State::from_json`] from JSON
//! text, with the same checks and messages as zt's Python loader had.
//!
//! ```
//! use zloader::{Mode, Sampler, State};
//! let mut run = Sampler::new(1000, 64, Mode::Cyclic, 7)?;
//! run.seek(40);
//! let saved = run.state().to_json(); // what Python's json.dumps(state_dict()) writes
//!
//! // Later, on rank 1 of 4: the same global stream, this rank's quarter.
//! let mut rank1 = Sampler::new(1000, 64, Mode::Cyclic, 7)?.sharded(1, 4)?;
//! rank1.resume(&State::from_json(&saved)?, false)?;
//! assert_eq!(rank1.next(), &run.next()[16..32]);
//! # Ok::<(), zloader::Error>(())
//! ```

use std::fmt;

use crate::error::{Error, Result};
use crate::sampler::{Mode, Plan};

/// The state format [`State::entries`] and [`State::to_json`] write.
pub const STATE_VERSION: u64 = 2;

/// The largest `samples_seen` a state can hold: `global_step *
/// global_batch_size`, both below 2^64.
pub const SAMPLES_MAX: u128 = (u64::MAX as u128) * (u64::MAX as u128);

/// One value of a saved state as the saver held it, before it is checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// An integer of any size, as decimal text (an optional `-`, then
    /// digits): how JSON and Python spell it.
    Int(String),
    /// A boolean, which Python's `operator.index` reads as 1 or 0.
    Bool(bool),
    /// A number with a fraction or an exponent.
    Float(f64),
    /// Anything else: its (Python) type name and how it is written.
    Other {
        /// `str`, `NoneType`, `list`, `dict`, ...
        type_name: String,
        /// Its repr, for messages.
        repr: String,
    },
}

impl Value {
    /// An integer value.
    pub fn int(value: impl Into<u128>) -> Value {
        Value::Int(value.into().to_string())
    }

    /// The value as an unsigned integer, when it is one that fits a u128.
    fn as_u128(&self) -> Option<u128> {
        match self {
            Value::Int(text) => match text.strip_prefix('-') {
                Some(digits) => digits.bytes().all(|b| b == b'0').then_some(0),
                None => text.parse().ok(),
            },
            Value::Bool(b) => Some(u128::from(*b)),
            _ => None,
        }
    }

    /// `value == n` as Python compares a number with an int.
    fn equals(&self, n: u128) -> bool {
        match self {
            Value::Int(_) | Value::Bool(_) => self.as_u128() == Some(n),
            Value::Float(f) => *f == n as f64,
            Value::Other { .. } => false,
        }
    }

    fn repr(&self) -> String {
        match self {
            Value::Int(text) => text.clone(),
            Value::Bool(b) => if *b { "True" } else { "False" }.into(),
            Value::Float(f) => python_float_repr(*f),
            Value::Other { repr, .. } => repr.clone(),
        }
    }

    fn type_name(&self) -> &str {
        match self {
            Value::Int(_) => "int",
            Value::Bool(_) => "bool",
            Value::Float(_) => "float",
            Value::Other { type_name, .. } => type_name,
        }
    }
}

/// A float as Python's `repr` writes it (`1e+20`, `2.5`, `inf`).
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let text = format!("{f:?}");
    match text.split_once('e') {
        None => text,
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mantissa = mantissa.strip_suffix(".0").unwrap_or(mantissa);
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}

/// One setting that differs between a saved state and this loader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Differ {
    /// The state's key: `length`, `global_batch_size`, `mode` or `seed`.
    pub key: &'static str,
    /// The saved value.
    pub saved: u64,
    /// This loader's value.
    pub here: u64,
}

/// The settings that differ, as the messages list them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Differences(pub Vec<Differ>);

impl fmt::Display for Differences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: saved {}, here {}", d.key, d.saved, d.here)?;
        }
        Ok(())
    }
}

/// Keys listed as Python lists them: `['a', 'b']`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys(pub Vec<&'static str>);

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, k) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "'{k}'")?;
        }
        f.write_str("]")
    }
}

/// A run's position for every rank at once (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The next step of the run.
    pub global_step: u64,
    /// The batch size over all ranks.
    pub global_batch_size: u64,
    /// Records in the index space.
    pub length: u64,
    /// The mode's number (loaderx's: SEQUENTIAL 0, IID 1, CYCLIC 2; and
    /// LOADERX_IID 3). Kept as saved: a state is only compared with it.
    pub mode: u64,
    /// The seed.
    pub seed: u64,
    /// Samples drawn over all ranks before `global_step`: `global_step`
    /// times the global batch (`length` for CYCLIC over fewer records than
    /// one batch).
    pub samples_seen: u128,
    /// BLOCK_SHUFFLE's records per block; 0 in every other mode.
    pub block_size: u64,
    /// The mixture's digest ([`crate::Mix::fingerprint`]); 0 for a loader
    /// over one dataset.
    pub mix: u64,
}

/// Indices in one global batch: the batch size, or the length for CYCLIC
/// over fewer records than one batch (as [`Plan::global_batch_len`]).
fn global_batch_len(length: u64, batch_size: u64, mode: u64) -> u64 {
    if mode == Mode::Cyclic as u64 && length < batch_size {
        length
    } else {
        batch_size
    }
}

/// The keys a version 2 state must hold, in the order they are written.
const V2_KEYS: [&str; 6] = [
    "global_step",
    "global_batch_size",
    "length",
    "mode",
    "seed",
    "samples_seen",
];
/// The keys a version 1 state must hold.
const V1_KEYS: [&str; 5] = ["step", "length", "batch_size", "mode", "seed"];
/// Every key read, version 1's included.
const KNOWN: [&str; 11] = [
    "version",
    "global_step",
    "global_batch_size",
    "length",
    "mode",
    "seed",
    "samples_seen",
    "step",
    "batch_size",
    "block_size",
    "mix",
];

/// The known keys of a saved state, the last of each kept (as a Python dict
/// or `json.loads` keeps it).
struct Fields([Option<Value>; KNOWN.len()]);

impl Fields {
    fn get(&self, key: &str) -> Option<&Value> {
        let i = KNOWN.iter().position(|k| *k == key)?;
        self.0[i].as_ref()
    }

    fn missing(&self, keys: &[&'static str]) -> Result<()> {
        let missing: Vec<&'static str> = keys
            .iter()
            .copied()
            .filter(|k| self.get(k).is_none())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::StateMissing(Keys(missing)))
        }
    }

    /// `key`'s value as an integer in `0..=high`.
    fn uint(&self, key: &'static str, high: u128, bound: &'static str) -> Result<u128> {
        let value = self.get(key).expect("checked present");
        if !matches!(value, Value::Int(_) | Value::Bool(_)) {
            return Err(Error::StateNotInteger {
                key,
                type_name: value.type_name().to_string(),
            });
        }
        match value.as_u128() {
            Some(v) if v <= high => Ok(v),
            _ => Err(Error::StateOutOfRange {
                key,
                value: value.repr(),
                bound,
            }),
        }
    }

    fn u64(&self, key: &'static str) -> Result<u64> {
        Ok(self.uint(key, u128::from(u64::MAX), "2^64-1")? as u64)
    }
}

impl State {
    /// The state of a run over `plan`'s settings whose next step is `step`
    /// (the same on every rank: only the global settings are read).
    pub fn at(plan: &Plan, step: u64) -> State {
        State {
            global_step: step,
            global_batch_size: plan.batch_size(),
            length: plan.length(),
            mode: plan.mode() as u64,
            seed: plan.seed(),
            samples_seen: u128::from(step) * u128::from(plan.global_batch_len()),
            block_size: if plan.mode() == Mode::BlockShuffle {
                plan.block_size()
            } else {
                0
            },
            mix: plan.mix().map_or(0, |m| m.fingerprint()),
        }
    }

    /// The saved form's keys and values, in the order they are written:
    /// `version` first, then [`State`]'s fields; `block_size` only in
    /// BLOCK_SHUFFLE and `mix` only for a mixture.
    pub fn entries(&self) -> Vec<(&'static str, u128)> {
        let mut entries = vec![
            ("version", u128::from(STATE_VERSION)),
            ("global_step", u128::from(self.global_step)),
            ("global_batch_size", u128::from(self.global_batch_size)),
            ("length", u128::from(self.length)),
            ("mode", u128::from(self.mode)),
            ("seed", u128::from(self.seed)),
            ("samples_seen", self.samples_seen),
        ];
        if self.block_size != 0 {
            entries.push(("block_size", u128::from(self.block_size)));
        }
        if self.mix != 0 {
            entries.push(("mix", u128::from(self.mix)));
        }
        entries
    }

    /// The saved form as JSON, spelled as Python's `json.dumps` spells the
    /// state dict.
    pub fn to_json(&self) -> String {
        let fields: Vec<String> = self
            .entries()
            .iter()
            .map(|(k, v)| format!("\"{k}\": {v}"))
            .collect();
        format!("{{{}}}", fields.join(", "))
    }

    /// Read a saved state (either version) from its keys and values, checked
    /// in the order and with the messages of zt's Python loader: the
    /// version; the keys present ([`Error::StateMissing`]); each setting an
    /// integer ([`Error::StateNotInteger`]) in range
    /// ([`Error::StateOutOfRange`]). Unknown keys are ignored; a repeated
    /// key's last value counts.
    pub fn from_entries<K: AsRef<str>>(
        entries: impl IntoIterator<Item = (K, Value)>,
    ) -> Result<State> {
        let mut fields = Fields(Default::default());
        for (key, value) in entries {
            if let Some(i) = KNOWN.iter().position(|k| *k == key.as_ref()) {
                fields.0[i] = Some(value);
            }
        }
        let version = fields.get("version").cloned().unwrap_or(Value::int(1u8));
        if version.equals(1) {
            fields.missing(&V1_KEYS)?;
            let length = fields.u64("length")?;
            let global_batch_size = fields.u64("batch_size")?;
            let mode = fields.u64("mode")?;
            let seed = fields.u64("seed")?;
            let step = fields.u64("step")?;
            let global = global_batch_len(length, global_batch_size, mode);
            return Ok(State {
                global_step: step,
                global_batch_size,
                length,
                mode,
                seed,
                samples_seen: u128::from(step) * u128::from(global),
                block_size: 0,
                mix: 0,
            });
        }
        if !version.equals(u128::from(STATE_VERSION)) {
            return Err(Error::StateVersion(version.repr()));
        }
        fields.missing(&V2_KEYS)?;
        let global_batch_size = fields.u64("global_batch_size")?;
        let length = fields.u64("length")?;
        let mode = fields.u64("mode")?;
        let seed = fields.u64("seed")?;
        // samples_seen is step * global batch, so past 2^64 from step 2^64 /
        // batch on: a state saved at any step (up to 2^64 - 1) loads.
        let samples_seen = fields.uint("samples_seen", SAMPLES_MAX, "(2^64-1)^2")?;
        let global_step = fields.u64("global_step")?;
        if mode == Mode::BlockShuffle as u64 {
            fields.missing(&["block_size"])?;
        }
        let optional = |key| match fields.get(key) {
            Some(_) => fields.u64(key),
            None => Ok(0),
        };
        let block_size = optional("block_size")?;
        let mix = optional("mix")?;
        Ok(State {
            global_step,
            global_batch_size,
            length,
            mode,
            seed,
            samples_seen,
            block_size,
            mix,
        })
    }

    /// Read a saved state from JSON text (a JSON object, as Python's
    /// `json.dumps(loader.state_dict())` writes it): values are typed as
    /// Python's `json.loads` types them, then checked by
    /// [`State::from_entries`].
    pub fn from_json(text: &str) -> Result<State> {
        State::from_entries(json::object(text)?)
    }

    /// The step a loader over `plan`'s settings resumes at: the saved step
    /// when the settings that decide the global stream match (the world size
    /// may differ), else, with `rebase`, the first step at which this
    /// loader's own stream has drawn at least `samples_seen` samples.
    /// Without `rebase` other settings are refused ([`Error::StateSettings`]).
    pub fn resume_step(&self, plan: &Plan, rebase: bool) -> Result<u64> {
        self.resume_step_named(plan, rebase, "loader")
    }

    /// [`State::resume_step`], naming the resuming thing `what` in its
    /// messages (`"DataLoader"`, `"sampler"`, ...).
    pub fn resume_step_named(&self, plan: &Plan, rebase: bool, what: &str) -> Result<u64> {
        let here = State::at(plan, 0);
        let here = [
            ("length", self.length, plan.length()),
            (
                "global_batch_size",
                self.global_batch_size,
                plan.batch_size(),
            ),
            ("mode", self.mode, plan.mode() as u64),
            ("seed", self.seed, plan.seed()),
            ("block_size", self.block_size, here.block_size),
            ("mix", self.mix, here.mix),
        ];
        let differ: Vec<Differ> = here
            .iter()
            .filter(|(_, saved, here)| saved != here)
            .map(|&(key, saved, here)| Differ { key, saved, here })
            .collect();
        if differ.is_empty() {
            return Ok(self.global_step);
        }
        let differ = Differences(differ);
        if !rebase {
            return Err(Error::StateSettings {
                what: what.to_string(),
                differ,
                samples_seen: self.samples_seen,
            });
        }
        let global = u128::from(plan.global_batch_len());
        let step = self.samples_seen.div_ceil(global);
        u64::try_from(step).map_err(|_| Error::RebasePastEnd {
            what: what.to_string(),
            differ,
            samples_seen: self.samples_seen,
            global_batch_len: plan.global_batch_len(),
        })
    }
}

/// A saved state's JSON read by zrecord's reader ([`zrecord::json`]), as
/// Python's `json.loads` reads it: each member's value as the saver held it.
mod json {
    use super::{python_float_repr, Value};
    use crate::error::{Error, Result};
    use zrecord::json::{self as reader, ErrorKind, Value as Json};

    /// Nesting deeper than this (the state's object counted) is refused
    /// rather than followed.
    const MAX_DEPTH: usize = 64;

    /// The reader's failure in this loader's words.
    fn fail(e: reader::Error) -> Error {
        let what = match e.kind {
            ErrorKind::Truncated | ErrorKind::UnexpectedCharacter | ErrorKind::NotUtf8 => {
                "expected a value"
            }
            ErrorKind::ExpectedColon => "expected ':'",
            ErrorKind::KeyNotString => "expected '\"'",
            ErrorKind::ExpectedCommaOrBrace => "expected ',' or '}'",
            ErrorKind::ExpectedCommaOrBracket => "expected ',' or a closing bracket",
            ErrorKind::TooDeep => "nested too deep",
            ErrorKind::MalformedNumber => "bad number",
            ErrorKind::UnterminatedString => "unterminated string",
            ErrorKind::TruncatedEscape
            | ErrorKind::MalformedEscape
            | ErrorKind::UnpairedSurrogate => "bad \\u escape",
            ErrorKind::InvalidEscape => "bad escape",
            ErrorKind::ControlCharacter => "control character in string",
            ErrorKind::TrailingBytes => "extra data",
        };
        Error::StateJson(format!("{what} at byte {}", e.at))
    }

    /// A string as Python's `repr` writes it (near enough for messages).
    fn str_repr(s: &str) -> String {
        format!("'{}'", s.escape_debug())
    }

    /// A value as Python's `repr` writes what `json.loads` made of it.
    fn repr(value: &Json) -> String {
        match value {
            Json::Null => "None".into(),
            Json::Bool(b) => if *b { "True" } else { "False" }.into(),
            Json::Int(text) => text.clone(),
            Json::Float(f) => python_float_repr(*f),
            Json::Str(s) => str_repr(s),
            Json::Array(items) => {
                let items: Vec<String> = items.iter().map(repr).collect();
                format!("[{}]", items.join(", "))
            }
            Json::Object(members) => {
                let members: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}: {}", str_repr(k), repr(v)))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
        }
    }

    /// A member's value as the saver held it.
    fn saved(value: Json) -> Value {
        match value {
            Json::Int(text) => Value::Int(text),
            Json::Bool(b) => Value::Bool(b),
            Json::Float(f) => Value::Float(f),
            other => Value::Other {
                type_name: other.python_type().into(),
                repr: repr(&other),
            },
        }
    }

    /// The members of the JSON object `text`, in order.
    pub(super) fn object(text: &str) -> Result<Vec<(String, Value)>> {
        match reader::decode(text.as_bytes(), MAX_DEPTH).map_err(fail)? {
            Json::Object(members) => Ok(members.into_iter().map(|(k, v)| (k, saved(v))).collect()),
            other => Err(Error::StateNotObject(other.python_type().to_string())),
        }
    }
}
