//! The saved state of a run: its form (Python's `state_dict()`, byte for
//! byte as JSON), both versions, the checks and their messages, re-basing
//! arithmetic at the edges, and the sampler's save and resume.

use zloader::state::{Value, SAMPLES_MAX};
use zloader::{Error, Mode, Plan, Sampler, State};

fn int(v: u128) -> Value {
    Value::int(v)
}

fn v2(step: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("version", int(2)),
        ("global_step", int(step.into())),
        ("global_batch_size", int(64)),
        ("length", int(5000)),
        ("mode", int(2)),
        ("seed", int(5)),
        ("samples_seen", int(u128::from(step) * 64)),
    ]
}

fn with(
    mut entries: Vec<(&'static str, Value)>,
    key: &'static str,
    value: Value,
) -> Vec<(&'static str, Value)> {
    entries.retain(|(k, _)| *k != key);
    entries.push((key, value));
    entries
}

fn without(mut entries: Vec<(&'static str, Value)>, key: &str) -> Vec<(&'static str, Value)> {
    entries.retain(|(k, _)| *k != key);
    entries
}

#[test]
fn the_saved_form_is_pythons_state_dict() {
    let plan = Plan::new(5000, 64, Mode::Cyclic, 5).unwrap();
    let state = State::at(&plan.shard(1, 4).unwrap(), 123);
    // json.dumps(Sampler(5000, 64, CYCLIC, 5).state_dict()) at step 123.
    assert_eq!(
        state.to_json(),
        r#"{"version": 2, "global_step": 123, "global_batch_size": 64, "length": 5000, "mode": 2, "seed": 5, "samples_seen": 7872}"#
    );
    assert_eq!(State::from_json(&state.to_json()).unwrap(), state);
    let entries = state.entries().into_iter().map(|(k, v)| (k, int(v)));
    assert_eq!(State::from_entries(entries).unwrap(), state);
    // CYCLIC over fewer records than one batch: a global batch is `length`.
    let short = State::at(&Plan::new(10, 64, Mode::Cyclic, 5).unwrap(), 3);
    assert_eq!((short.global_batch_size, short.samples_seen), (64, 30));
}

#[test]
fn states_at_the_last_step_round_trip() {
    let plan = Plan::new(150, 8, Mode::Iid, 5).unwrap();
    for step in [0, 1 << 63, u64::MAX] {
        let state = State::at(&plan, step);
        assert_eq!(state.samples_seen, u128::from(step) * 8);
        let back = State::from_json(&state.to_json()).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.resume_step(&plan, false), Ok(step));
    }
}

#[test]
fn the_first_format_still_loads() {
    let old = |step: u128, length: u128| {
        vec![
            ("length", int(length)),
            ("batch_size", int(12)),
            ("mode", int(2)),
            ("seed", int(4)),
            ("step", int(step)),
        ]
    };
    let state = State::from_entries(old(9, 150)).unwrap();
    let plan = Plan::new(150, 12, Mode::Cyclic, 4).unwrap();
    assert_eq!(state, State::at(&plan, 9));
    // version 1, spelled out (Python's True == 1 too).
    assert_eq!(
        State::from_entries(with(old(9, 150), "version", int(1))).unwrap(),
        state
    );
    assert_eq!(
        State::from_entries(with(old(9, 150), "version", Value::Float(1.0))).unwrap(),
        state
    );
    assert_eq!(
        State::from_entries(with(old(9, 150), "version", Value::Bool(true))).unwrap(),
        state
    );
    // Checked in the first format's order: length before batch_size.
    let e = State::from_entries(with(
        with(old(9, 150), "batch_size", int(1 << 64)),
        "length",
        Value::Float(1.0),
    ))
    .unwrap_err();
    assert_eq!(e.to_string(), "length must be an integer, got float");
    // Short CYCLIC: samples_seen counts `length` per step.
    assert_eq!(State::from_entries(old(9, 10)).unwrap().samples_seen, 90);
    let other_seed = Plan::new(150, 12, Mode::Cyclic, 5).unwrap();
    let refused = state
        .resume_step_named(&other_seed, false, "sampler")
        .unwrap_err();
    assert!(
        refused.to_string().contains("seed: saved 4, here 5"),
        "{refused}"
    );
    let missing = State::from_entries(without(old(9, 150), "step")).unwrap_err();
    assert_eq!(missing.to_string(), "loader state lacks ['step']");
}

#[test]
fn bad_states_are_refused_with_pythons_messages() {
    let check = |entries: Vec<(&'static str, Value)>, message: &str| {
        let e = State::from_entries(entries).unwrap_err();
        assert_eq!(e.to_string(), message);
        e
    };
    let e = check(
        with(v2(3), "version", int(9)),
        "loader state version 9 is not one this zt reads (1 or 2)",
    );
    assert!(matches!(e, Error::StateVersion(_)));
    check(
        with(v2(3), "version", Value::Float(2.5)),
        "loader state version 2.5 is not one this zt reads (1 or 2)",
    );
    check(
        with(
            v2(3),
            "version",
            Value::Other {
                type_name: "str".into(),
                repr: "'2'".into(),
            },
        ),
        "loader state version '2' is not one this zt reads (1 or 2)",
    );
    assert!(State::from_entries(with(v2(3), "version", Value::Float(2.0))).is_ok());
    check(
        with(v2(3), "version", Value::Bool(false)),
        "loader state version False is not one this zt reads (1 or 2)",
    );
    // A bool is an integer to Python's operator.index.
    assert_eq!(
        State::from_entries(with(v2(3), "seed", Value::Bool(true)))
            .unwrap()
            .seed,
        1
    );
    let e = check(
        without(without(v2(3), "global_step"), "samples_seen"),
        "loader state lacks ['global_step', 'samples_seen']",
    );
    assert!(matches!(e, Error::StateMissing(_)));
    let e = check(
        with(v2(3), "seed", Value::Float(5.0)),
        "seed must be an integer, got float",
    );
    assert!(matches!(e, Error::StateNotInteger { key: "seed", .. }));
    check(
        with(v2(3), "length", int(1 << 64)),
        "length must be in 0..2^64-1, got 18446744073709551616",
    );
    check(
        with(v2(3), "mode", Value::Int("-1".into())),
        "mode must be in 0..2^64-1, got -1",
    );
    // The settings are checked in Python's order: global_batch_size first.
    check(
        with(
            with(v2(3), "seed", int(1 << 64)),
            "global_batch_size",
            Value::Float(1.0),
        ),
        "global_batch_size must be an integer, got float",
    );
    check(
        with(v2(3), "samples_seen", int(SAMPLES_MAX + 1)),
        "samples_seen must be in 0..(2^64-1)^2, got 340282366920938463426481119284349108226",
    );
    assert_eq!(
        State::from_entries(with(v2(3), "samples_seen", int(SAMPLES_MAX)))
            .unwrap()
            .samples_seen,
        SAMPLES_MAX
    );
    // Values of any size, as decimal text.
    check(
        with(v2(3), "global_step", Value::Int("1".repeat(60))),
        &format!("global_step must be in 0..2^64-1, got {}", "1".repeat(60)),
    );
    // Unknown keys are ignored; "-0" is zero.
    let state = State::from_entries(with(
        with(v2(3), "note", int(1)),
        "seed",
        Value::Int("-0".into()),
    ))
    .unwrap();
    assert_eq!(state.seed, 0);
}

#[test]
fn json_is_read_as_pythons_json_loads_types_it() {
    let text = r#" { "version": 2, "global_step": 3, "global_batch_size": 64, "length": 5000,
        "mode": 2, "seed": 5, "samples_seen": 192, "extra": [1, {"a": null}] } "#;
    assert_eq!(State::from_json(text).unwrap().global_step, 3);
    let bad = |text: &str| State::from_json(text).unwrap_err().to_string();
    assert_eq!(bad("[1, 2]"), "a loader state must be a dict, got list");
    assert_eq!(
        bad(r#"{"version": "2"}"#),
        "loader state version '2' is not one this zt reads (1 or 2)"
    );
    assert_eq!(
        bad(r#"{"version": 1e20}"#),
        "loader state version 1e+20 is not one this zt reads (1 or 2)"
    );
    assert_eq!(
        bad(r#"{"version": null}"#),
        "loader state version None is not one this zt reads (1 or 2)"
    );
    // true is 1 (a bool is an int to Python's operator.index).
    assert_eq!(
        State::from_json(&text.replace("\"seed\": 5", "\"seed\": true"))
            .unwrap()
            .seed,
        1
    );
    assert_eq!(
        bad(&text.replace("\"seed\": 5", "\"seed\": \"5\"")),
        "seed must be an integer, got str"
    );
    assert!(bad(r#"{"version": 2"#).starts_with("a loader state is not valid JSON"));
    assert!(bad(r#"{"version": 02}"#).starts_with("a loader state is not valid JSON"));
    assert!(bad(r#"{"version": 2} x"#).starts_with("a loader state is not valid JSON"));
    let deep = format!("{{\"x\": {}{}}}", "[".repeat(100), "]".repeat(100));
    assert!(bad(&deep).starts_with("a loader state is not valid JSON"));
}

#[test]
fn rebasing_at_the_edges() {
    let saved = State::at(&Plan::new(150, 12, Mode::Cyclic, 1).unwrap(), 5); // 60 samples
    for (batch, step) in [(20u64, 3u64), (7, 9), (60, 1), (61, 1), (1, 60)] {
        let plan = Plan::new(150, batch, Mode::Cyclic, 1).unwrap();
        assert_eq!(saved.resume_step(&plan, true), Ok(step), "batch {batch}");
        let refused = saved.resume_step(&plan, false).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "loader state was saved with different settings (global_batch_size: saved 12, here {batch}): \
                 resuming would not continue the same sample sequence. Build the loader with the saved \
                 settings (the world size may change; the global batch may not), or pass rebase=True to \
                 start this loader's own sequence at the saved sample count (60 samples)."
            )
        );
    }
    // Every differing setting is named, in order.
    let plan = Plan::new(151, 12, Mode::Iid, 2).unwrap();
    let refused = saved
        .resume_step_named(&plan, false, "DataLoader")
        .unwrap_err();
    assert!(refused.to_string().starts_with(
        "DataLoader state was saved with different settings (length: saved 150, here 151, mode: saved 2, here 1, \
         seed: saved 1, here 2)"
    ));
    // A sample count no step below 2^64 reaches.
    let last = State::at(&Plan::new(150, 16, Mode::Iid, 1).unwrap(), u64::MAX);
    let plan = Plan::new(150, 8, Mode::Iid, 1).unwrap();
    let e = last
        .resume_step_named(&plan, true, "DataLoader")
        .unwrap_err();
    assert!(matches!(e, Error::RebasePastEnd { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "DataLoader state was saved with different settings (global_batch_size: saved 16, here 8) and \
             rebase=True, but its sample count ({}) is past this DataLoader's last step (2^64-1 steps of 8 \
             samples): there is no step to resume at.",
            u128::from(u64::MAX) * 16
        )
    );
    // Just reachable: the last step.
    let plan = Plan::new(150, 16, Mode::Iid, 2).unwrap();
    assert_eq!(last.resume_step(&plan, true), Ok(u64::MAX));
}

#[test]
fn a_sampler_saves_and_resumes() {
    let mut a = Sampler::new(5000, 64, Mode::Cyclic, 5).unwrap();
    for _ in 0..123 {
        a.next();
    }
    let state = State::from_json(&a.state().to_json()).unwrap();
    // Resumed on rank 1 of 2: the second half of each global batch.
    let mut b = Sampler::new(5000, 64, Mode::Cyclic, 5)
        .unwrap()
        .sharded(1, 2)
        .unwrap();
    b.resume(&state, false).unwrap();
    assert_eq!(b.step(), 123);
    for _ in 0..50 {
        let whole = a.next().to_vec();
        assert_eq!(b.next(), &whole[32..]);
    }
    let mut c = Sampler::new(5000, 64, Mode::Cyclic, 6).unwrap();
    c.seek(7);
    let e = c.resume(&state, false).unwrap_err();
    assert!(e
        .to_string()
        .starts_with("sampler state was saved with different settings (seed: saved 5, here 6)"));
    assert_eq!(c.step(), 7);
}
