//! Rematerialization: which activations a step keeps and which it recomputes, in
//! device memory alone. Rotor's dynamic programs on a chain (`rotor`, `rotor_optimal`,
//! Revolve's `revolve`), Rockmate's `rk_rotor` over block options, and `multichain`
//! for graphs made of several chains.

pub mod multichain;
pub mod revolve;
pub mod rk_rotor;
pub mod rotor;
pub mod rotor_optimal;
