//! cudasim: a simulated CUDA driver API (work in progress, see issue 4).
