//! What the executor needs from CUDA below Burn's `Backend` trait: device memory summed
//! over the CUDA streams its threads allocate on, and offload reads queued on a copy
//! stream of their own (opt-in).
//!
//! Read from the sources of burn-cuda 0.21 and CubeCL 0.10 (pinned, `Cargo.toml`), as
//! `docs/gpu.md` records:
//! * CubeCL gives each OS thread its own stream (`StreamId::current`, an id per thread,
//!   the stream `id % max_streams`), and each stream its own memory pools.
//!   `ComputeClient::memory_usage` reports the calling thread's stream alone, so device
//!   tensors the host→device thread uploads are missed by a probe on the compute thread.
//! * A read (`float_into_data`) on the device→host thread waits, on its own stream, for
//!   an event at the end of everything the compute thread had queued when the read was
//!   handled, not only for the tensor's producer. Queuing the read from the compute
//!   thread when the offload is issued puts that event right after the producer.

use std::any::Any;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorData};
use cubecl::cuda::CudaRuntime;
use cubecl::server::CopyDescriptor;
use cubecl::Runtime;
use cubecl_common::stream_id::StreamId;

type Inner = burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>;
type Client = cubecl::client::ComputeClient<CudaRuntime>;

/// CubeCL's default `streaming.max_streams`: stream ids equal modulo it share a stream.
const MAX_STREAMS: u64 = 128;

/// The streams whose memory pools the probe sums (by index, `id % MAX_STREAMS`), and
/// those of them whose thread has ended: such a stream is dropped from the sum once it
/// holds nothing, since no thread allocates on it any more.
struct Streams {
    live: BTreeSet<u64>,
    retired: BTreeSet<u64>,
}

static STREAMS: Mutex<Streams> = Mutex::new(Streams { live: BTreeSet::new(), retired: BTreeSet::new() });

fn streams() -> std::sync::MutexGuard<'static, Streams> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A registered thread's stream, retired when the thread ends (its thread-local is dropped).
struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        streams().retired.insert(self.0);
    }
}

thread_local! {
    static REGISTERED: std::cell::OnceCell<Registration> = const { std::cell::OnceCell::new() };
}

/// Counts the calling thread's stream in [`bytes_in_use`] from now on (once per thread).
pub(crate) fn register_stream() {
    let _ = REGISTERED.try_with(|r| {
        r.get_or_init(|| {
            let index = StreamId::current().value % MAX_STREAMS;
            let mut s = streams();
            s.live.insert(index);
            s.retired.remove(&index);
            Registration(index)
        });
    });
}

fn client() -> Client {
    CudaRuntime::client(&burn_cuda::CudaDevice::default())
}

/// Device memory in use on the first CUDA device: the bytes in use of every stream a
/// thread of the executor allocated on (the compute thread, the transfer threads while
/// they run, and after them while their streams still hold tensors), as CubeCL's memory
/// manager reports them. One round trip to the device's thread per stream.
pub(crate) fn bytes_in_use() -> u64 {
    register_stream();
    let live: Vec<u64> = streams().live.iter().copied().collect();
    let base = client();
    let mut total = 0;
    for value in live {
        let mut c = base.clone();
        // SAFETY: the client only reads the memory report of a stream that exists.
        unsafe { c.set_stream(StreamId { value }) };
        let bytes = c.memory_usage().map(|u| u.bytes_in_use).unwrap_or(0);
        if bytes == 0 {
            let mut s = streams();
            if s.retired.remove(&value) {
                s.live.remove(&value);
            }
        }
        total += bytes;
    }
    total
}

/// Whether offload reads are queued on the copy stream when they are issued
/// (`PEBBLE_CUDA_READ=queued`), instead of being read on the device→host thread.
pub(crate) fn queued_reads() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("PEBBLE_CUDA_READ").is_ok_and(|v| v == "queued"))
}

/// A read queued on the copy stream: waiting on it gives the tensor's data.
pub(crate) type QueuedRead = Pin<Box<dyn Future<Output = Result<TensorData, String>> + Send>>;

/// The client of the copy stream, kept for the process: a queued read borrows it until
/// it is done. Its stream is that of a thread started for the purpose, so that no other
/// thread of the process issues on it. Reads allocate no device memory, so the probe
/// leaves it out.
fn copy_client() -> &'static Client {
    static COPY: OnceLock<Client> = OnceLock::new();
    COPY.get_or_init(|| {
        let stream = std::thread::spawn(StreamId::current).join().unwrap_or_else(|_| StreamId::current());
        let mut c = client();
        // SAFETY: reads only are issued through this client; CubeCL orders each after the
        // work queued on the stream that owns the tensor with an event between the streams.
        unsafe { c.set_stream(stream) };
        c
    })
}

/// Queues the read of float tensor `t` on the copy stream, if this is CUDA and queued
/// reads are on; otherwise hands `t` back. Called on the compute thread when the offload
/// is issued: Burn's fusion runs the ops queued on this thread first, and the copy waits
/// on the device for them only. The data lands in CubeCL's pinned buffers as soon as the
/// device has copied it; the executor's host pool admits the host copy, and the link's
/// throttle starts, when the device→host thread takes the job, as for a read it makes.
pub(crate) fn queue_read<B: Backend>(t: FloatTensor<B>) -> Result<QueuedRead, FloatTensor<B>> {
    if !queued_reads() {
        return Err(t);
    }
    let any: Box<dyn Any> = Box::new(t);
    let fused = match any.downcast::<FloatTensor<burn_cuda::Cuda>>() {
        Ok(fused) => *fused,
        Err(any) => return Err(*any.downcast::<FloatTensor<B>>().expect("the type it was boxed as")),
    };
    let tensor = fused.client.clone().resolve_tensor_float::<Inner>(fused);
    let tensor = burn_cubecl::kernel::into_contiguous_aligned(tensor);
    let shape = tensor.meta.shape().clone();
    let descriptor = CopyDescriptor::new(
        tensor.handle.clone().binding(),
        shape.clone(),
        tensor.meta.strides().clone(),
        tensor.elem_size(),
    );
    let dtype = tensor.dtype;
    let read = copy_client().read_one_tensor_async(descriptor);
    Ok(Box::pin(async move {
        let bytes = read.await.map_err(|e| e.to_string())?;
        // The device buffer lives until its copy is done.
        drop(tensor);
        Ok(TensorData::from_bytes(bytes, shape, dtype))
    }))
}
