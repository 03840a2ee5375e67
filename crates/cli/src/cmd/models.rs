//! `pebble models`: the zoo catalog.

use std::process::ExitCode;

use serde_json::json;

use crate::flags::ModelsArgs;
use crate::out;

pub fn run(args: &ModelsArgs) -> anyhow::Result<ExitCode> {
    let catalog = pebble_zoo::catalog();
    if args.json {
        let models: Vec<_> = catalog
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "family": s.family,
                    "description": s.description,
                    "published_params": s.published_params.map(|(n, _)| n),
                    "published_params_source": s.published_params.map(|(_, src)| src),
                    "defaults": {
                        "batch": s.batch,
                        "image": s.image,
                        "seq": s.seq,
                        "layers": s.layers,
                    },
                })
            })
            .collect();
        out::print_json(&serde_json::Value::Array(models))?;
        return Ok(ExitCode::SUCCESS);
    }
    let header: Vec<String> =
        ["model", "family", "params", "batch", "image", "seq", "layers", "description"].map(String::from).into();
    let dash = || "-".to_string();
    let opt = |v: Option<usize>| v.map_or_else(dash, |v| v.to_string());
    let rows: Vec<Vec<String>> = catalog
        .iter()
        .map(|s| {
            vec![
                s.name.to_string(),
                s.family.to_string(),
                s.published_params.map_or_else(dash, |(n, _)| n.to_string()),
                s.batch.to_string(),
                opt(s.image),
                opt(s.seq),
                opt(s.layers),
                s.description.to_string(),
            ]
        })
        .collect();
    out::print(&out::table(&header, &rows, &[false, false, true, true, true, true, true, false]))?;
    Ok(ExitCode::SUCCESS)
}
