//! The values an executor holds: float, integer and boolean tensors of a backend.

use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{Backend, TensorMetadata};

/// A tensor of any element type, as Burn's primitives hold them.
pub enum Value<B: Backend> {
    /// A float tensor (activations, gradients, parameters).
    Float(FloatTensor<B>),
    /// An integer tensor (token ids, labels, pooling indices).
    Int(IntTensor<B>),
    /// A boolean tensor (dropout masks).
    Bool(BoolTensor<B>),
}

impl<B: Backend> Clone for Value<B> {
    fn clone(&self) -> Self {
        match self {
            Value::Float(t) => Value::Float(t.clone()),
            Value::Int(t) => Value::Int(t.clone()),
            Value::Bool(t) => Value::Bool(t.clone()),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Value<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.kind(), self.dims())
    }
}

impl<B: Backend> Value<B> {
    /// `float`, `int` or `bool`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Float(_) => "float",
            Value::Int(_) => "int",
            Value::Bool(_) => "bool",
        }
    }

    /// The shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Value::Float(t) => t.shape().to_vec(),
            Value::Int(t) => t.shape().to_vec(),
            Value::Bool(t) => t.shape().to_vec(),
        }
    }

    /// The float tensor, or `None`.
    pub fn float(self) -> Option<FloatTensor<B>> {
        match self {
            Value::Float(t) => Some(t),
            _ => None,
        }
    }

    /// The integer tensor, or `None`.
    pub fn int(self) -> Option<IntTensor<B>> {
        match self {
            Value::Int(t) => Some(t),
            _ => None,
        }
    }

    /// The boolean tensor, or `None`.
    pub fn bool(self) -> Option<BoolTensor<B>> {
        match self {
            Value::Bool(t) => Some(t),
            _ => None,
        }
    }
}
