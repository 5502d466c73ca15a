//! C ABI (see issue: stable C ABI). Intentionally empty for now.
