//! Resume a run from a saved state and print what it reads: the
//! cross-language check of `zloader::State` (tests/test_loader_state_rust.py
//! runs it against zt's Python loader).
//!
//! ```text
//! resume STORE BATCH_SIZE MODE SEED RANK WORLD_SIZE STATE STEPS
//! ```
//!
//! Opens the zrecord store `STORE`, starts a [`zloader::DataLoader`] over it
//! with those settings (rank `RANK` of `WORLD_SIZE`), resumes it from the
//! JSON state in the file `STATE` (`-`: start at step 0), takes `STEPS`
//! batches and prints each one's record indices as a JSON list, one line
//! each, then the loader's state as JSON (`State::to_json`, which is
//! Python's `json.dumps(loader.state_dict())`).

use std::process::ExitCode;
use std::sync::Arc;

use zloader::dataloader::{Config, DEFAULT_PREFETCH_BYTES};
use zloader::{DataLoader, Mode, Plan, State, Stream};

fn run(args: &[String]) -> Result<(), String> {
    let [store, batch_size, mode, seed, rank, world_size, state, steps] = args else {
        return Err("usage: resume STORE BATCH_SIZE MODE SEED RANK WORLD_SIZE STATE STEPS".into());
    };
    let int = |s: &String| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let reader = Arc::new(zrecord::Reader::open_any(store).map_err(|e| e.to_string())?);
    let (rank, world_size) = (int(rank)?, int(world_size)?);
    let mode = Mode::try_from(int(mode)?).map_err(|e| e.to_string())?;
    let plan = Plan::new(reader.len(), int(batch_size)?, mode, int(seed)?)
        .and_then(|p| p.shard(rank, world_size))
        .map_err(|e| e.to_string())?;
    let config = Config {
        plan,
        workers: 2,
        prefetch: 2,
        prefetch_bytes: DEFAULT_PREFETCH_BYTES,
        start_step: 0,
        step_stride: 1,
    };
    let stream = Stream {
        name: "d".into(),
        reader,
    };
    let loader = DataLoader::plain(vec![stream], config).map_err(|e| e.to_string())?;
    if state != "-" {
        let text = std::fs::read_to_string(state).map_err(|e| format!("{state}: {e}"))?;
        let saved = State::from_json(&text).map_err(|e| e.to_string())?;
        drop(loader.resume(&saved, false).map_err(|e| e.to_string())?);
    }
    for _ in 0..int(steps)? {
        let batch = loader
            .next()
            .ok_or("the loader closed")?
            .map_err(|e| e.to_string())?;
        let ids: Vec<String> = batch.indices.iter().map(u64::to_string).collect();
        println!("[{}]", ids.join(", "));
    }
    println!("{}", loader.state().map_err(|e| e.to_string())?.to_json());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("resume: {e}");
            ExitCode::FAILURE
        }
    }
}
