//! libgdrapi
