//! The values an executor holds: float, integer and boolean tensors of a backend, their
//! size, and the two calls that wait for the device and read a tensor back.

use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{Backend, TensorMetadata};

use crate::RuntimeError;

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

    /// Bytes the value holds on its device (elements × element size).
    pub fn bytes(&self) -> u64 {
        let (n, size) = match self {
            Value::Float(t) => (t.shape().num_elements(), t.dtype().size()),
            Value::Int(t) => (t.shape().num_elements(), t.dtype().size()),
            Value::Bool(t) => (t.shape().num_elements(), t.dtype().size()),
        };
        (n * size) as u64
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

/// fp32 zeros of `shape`, made in place: burn-flex's `float_zeros` allocates a byte buffer
/// and copies it once to meet its alignment rule (`Bytes::from_bytes_vec`), so that for a
/// moment it holds the tensor twice; a typed buffer is taken as it is. The parameter
/// gradients' zeros are made here, so that a step's peak is not their copy's.
pub fn zeros<B: Backend>(shape: Vec<usize>, device: &B::Device) -> FloatTensor<B> {
    B::float_from_data(burn_backend::TensorData::zeros::<f32, _>(shape), device)
}

/// Waits for the device to finish what it was given ([`RuntimeError::Device`] if it failed).
pub fn sync<B: Backend>(device: &B::Device) -> Result<(), RuntimeError> {
    B::sync(device).map_err(|e| RuntimeError::Device(format!("{e:?}")))
}

/// Reads a float tensor back to the host ([`RuntimeError::Readback`] if it cannot).
pub fn read_floats<B: Backend>(t: FloatTensor<B>) -> Result<Vec<f32>, RuntimeError> {
    let data = burn_backend::read_sync(B::float_into_data(t)).map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
    data.convert::<f32>().to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))
}
