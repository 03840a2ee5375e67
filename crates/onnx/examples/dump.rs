//! Prints what an ONNX file imports to: ops, shapes, stages and parameter count.
//! `cargo run -p pebble-onnx --example dump -- FILE [BATCH]`
use pebble_onnx::{import_file, ImportOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: dump FILE [BATCH]");
        std::process::exit(2);
    };
    let batch = args.next().and_then(|b| b.parse().ok());
    match import_file(path.as_ref(), &ImportOptions { batch, ..Default::default() }) {
        Ok(net) => {
            for op in &net.ops {
                println!("{:>3} {:<24} {:<20} {:?}", op.stage, op.name, op.kind.name(), op.decl.output);
            }
            println!("{} ops, {} stages, {} parameters", net.ops.len(), net.stages(), net.param_count());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
