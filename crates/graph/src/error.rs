use thiserror::Error;

/// Why a chain or a training graph was rejected. Each variant names the field at fault.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum GraphError {
    /// The file is not valid JSON, or a field has the wrong JSON type.
    #[error("malformed {what}: {message}")]
    Malformed {
        /// What was being read ("chain", "graph").
        what: &'static str,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A required field is absent.
    #[error("missing field `{field}`")]
    MissingField {
        /// The field's name.
        field: String,
    },
    /// A size is negative, fractional, not finite or beyond [`MAX_SIZE`](crate::MAX_SIZE).
    #[error("field `{field}`: a size must be a non-negative integer of at most 2^50 (1 PiB), got {value}")]
    BadSize {
        /// The field and index, e.g. `x[3]`.
        field: String,
        /// The offending value, as written.
        value: String,
    },
    /// A time is negative, not finite or beyond [`MAX_TIME`](crate::MAX_TIME).
    #[error("field `{field}`: a time must be a non-negative number of at most 1e15, got {value}")]
    BadTime {
        /// The field and index, e.g. `ftime[0]`.
        field: String,
        /// The offending value, as written.
        value: String,
    },
    /// Two arrays whose lengths are tied disagree.
    #[error("field `{field}` has length {found}, expected {expected} ({why})")]
    Length {
        /// The field whose length is off.
        field: String,
        /// Its length.
        found: usize,
        /// The length it must have.
        expected: usize,
        /// The rule that ties the lengths.
        why: &'static str,
    },
    /// A chain needs at least one stage.
    #[error("a chain needs at least one stage (field `ftime` is empty)")]
    EmptyChain,
    /// `xbar[i]` must hold at least `x[i]`, since the saved graph of a stage includes its output.
    #[error(
        "field `xbar[{index}]` = {xbar} is smaller than `x[{index}]` = {x}; a stage's saved set includes its output"
    )]
    XbarBelowX {
        /// The activation index.
        index: usize,
        /// `xbar[index]`.
        xbar: u64,
        /// `x[index]`.
        x: u64,
    },
    /// A node refers to a node id that does not exist.
    #[error("field `{field}`: id {id} is out of range (there are {count})")]
    BadId {
        /// Where the reference is, e.g. `compute[4].inputs`.
        field: String,
        /// The id.
        id: usize,
        /// How many nodes of that kind exist.
        count: usize,
    },
    /// Some structural rule of the training graph is broken.
    #[error("invalid graph: {0}")]
    Invalid(String),
}
