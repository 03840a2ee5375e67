//! `pebble info`: a model's size, static memory, store-all peak and time.

use std::process::ExitCode;

use pebble_graph::units::format_bytes;
use serde_json::json;

use crate::flags::InfoArgs;
use crate::out;
use crate::source::{load_model, Subject, Units};

pub fn run(args: &InfoArgs) -> anyhow::Result<ExitCode> {
    let (model, options) = load_model(args.model.model_source(), &args.opts)?;
    let params = model.network.param_count();
    let param_bytes = model.graph.param_bytes();
    let static_bytes = model.graph.static_bytes();
    let chain_length = model.chain.len();
    let flops = model.network.flops();
    // The store-all peak is that of plain autograd on the training graph.
    let graph = Subject::Graph(model.graph);
    let store_all = graph.store_all(&options.profile.machine)?;
    let activation_peak = store_all.peak_bytes.saturating_sub(static_bytes);
    let d = &model.dims;
    if args.json {
        out::print_json(&json!({
            "model": model.spec.name,
            "family": model.spec.family,
            "batch": d.batch,
            "image": model.spec.image.map(|_| d.image),
            "seq": model.spec.seq.map(|_| d.seq),
            "layers": model.spec.layers.map(|_| d.layers),
            "dtype": d.dtype.name(),
            "optimizer": options.optimizer.name(),
            "device": options.profile.name,
            "profile": options.profile.name,
            "params": params,
            "published_params": model.spec.published_params.map(|(n, _)| n),
            "param_bytes": param_bytes,
            "static_bytes": static_bytes,
            "store_all_peak_bytes": store_all.peak_bytes,
            "activation_peak_bytes": activation_peak,
            "store_all_time": store_all.makespan,
            "flops": flops,
            "chain_length": chain_length,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut shape = format!("batch {}", d.batch);
    if model.spec.image.is_some() {
        shape.push_str(&format!(", image {}", d.image));
    }
    if model.spec.seq.is_some() {
        shape.push_str(&format!(", seq {}", d.seq));
    }
    if model.spec.layers.is_some() {
        shape.push_str(&format!(", {} layers", d.layers));
    }
    let published = match model.spec.published_params {
        Some((n, src)) if n == params => format!(" (= {src})"),
        Some((n, src)) => format!(" ({src}: {n})"),
        None => String::new(),
    };
    let text = format!(
        "{name} ({family}): {description}\n\
         shape            {shape}; {device}, {optimizer}\n\
         parameters       {params}{published}, {param_bytes}\n\
         static memory    {static_bytes} (parameters, gradients, optimizer state)\n\
         store-all peak   {peak}\n\
         activation peak  {activation}\n\
         store-all time   {time}\n\
         FLOPs per step   {flops:.3e}\n\
         chain length     {chain_length} stages\n",
        name = model.spec.name,
        family = model.spec.family,
        description = model.spec.description,
        device = options.profile.name,
        optimizer = options.optimizer.name(),
        param_bytes = format_bytes(param_bytes),
        static_bytes = format_bytes(static_bytes),
        peak = format_bytes(store_all.peak_bytes),
        activation = format_bytes(activation_peak),
        time = Units::Bytes.time(store_all.makespan),
    );
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
