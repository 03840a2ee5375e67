//! An imported network as a zoo [`Model`]: its catalog entry and sizes read off the graph.

use pebble_zoo::{Dims, Model, ModelOptions, ModelSpec, Network, ZooError};

/// `network` (imported from `source`, which the catalog entry's description names) as a
/// model with both views, on `options` (its batch is the one imported with). The batch
/// is the labels' length; the image side, the height of a 4-D input's.
pub fn imported_model(network: Network, source: &str, options: &ModelOptions) -> Result<Model, ZooError> {
    let labels = network.ops.last().and_then(|loss| loss.inputs.get(1)).map(|&t| &network.tensors[t].shape);
    let batch = labels.and_then(|s| s.first().copied()).unwrap_or(1);
    let image = network.tensors.iter().find(|t| t.producer.is_none() && t.shape.len() == 4).map(|t| t.shape[2]);
    let spec = spec(source, &network, batch, image);
    let dims = Dims { batch, image: image.unwrap_or(0), seq: 0, layers: 0, width: 0, heads: 0, dtype: options.dtype };
    Model::from_network(spec, dims, network, options)
}

/// The catalog entry of an imported model. A [`Model`] refers to its entry for the
/// lifetime of the program; a run imports at most one file, so the entry (a few strings)
/// is leaked rather than threaded through every command.
fn spec(source: &str, network: &Network, batch: usize, image: Option<usize>) -> &'static ModelSpec {
    fn not_by_name(_: &Dims) -> Result<Network, ZooError> {
        Err(ZooError::Shape { op: "onnx", why: "an imported model is built from its file, not by name".into() })
    }
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    Box::leak(Box::new(ModelSpec {
        name: leak(network.name.clone()),
        family: "onnx",
        description: leak(format!("imported from {source}")),
        published_params: None,
        batch,
        image,
        seq: None,
        layers: None,
        max_seq: None,
        width: None,
        heads: None,
        build: not_by_name,
    }))
}
