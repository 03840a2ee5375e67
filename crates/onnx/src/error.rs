//! Why a file could not be imported. Every variant names what is at fault: the file, the
//! graph input or output, or the node (its name and op type) and the field.

use std::path::PathBuf;

use thiserror::Error;

/// An import failure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a protobuf `ModelProto`.
    #[error("not an ONNX model: protobuf decoding failed ({0})")]
    Decode(String),
    /// A well-formed protobuf that is not a usable model (no graph, no output, ...).
    #[error("malformed ONNX model: {0}")]
    Malformed(String),
    /// An operator pebble has no op for.
    #[error("node `{node}`: unsupported op `{op}`{}", domain_note(.domain))]
    UnsupportedOp {
        /// The node's name (or its first output's, when it has none).
        node: String,
        /// The op type.
        op: String,
        /// The operator set's domain (empty for the default `ai.onnx`).
        domain: String,
    },
    /// A known operator used in a way pebble cannot represent (asymmetric convolution
    /// padding, a product of two activations, ...).
    #[error("node `{node}` ({op}): unsupported: {why}")]
    Unsupported {
        /// The node.
        node: String,
        /// The op type.
        op: String,
        /// What is not supported.
        why: String,
    },
    /// A node whose inputs or attributes are malformed, or whose shapes do not fit.
    #[error("node `{node}` ({op}): {why}")]
    Node {
        /// The node.
        node: String,
        /// The op type.
        op: String,
        /// What is wrong, naming the input or attribute.
        why: String,
    },
    /// A graph input that cannot be used (unknown shape, symbolic dimension, ...).
    #[error("graph input `{input}`: {why}")]
    Input {
        /// The input's name.
        input: String,
        /// What is wrong.
        why: String,
    },
    /// The network the graph lowers to was rejected by the zoo (a bug of the importer's
    /// shape inference, reported rather than hidden).
    #[error("building the network: {0}")]
    Zoo(#[from] pebble_zoo::ZooError),
}

fn domain_note(domain: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        String::new()
    } else {
        format!(" (domain `{domain}`)")
    }
}
