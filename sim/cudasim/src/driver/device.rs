//! Device queries: attributes, PCI address, memory size.

use super::config::R;
use super::state::{Backend, Driver};
use crate::gpusim;
use crate::types::*;

impl Driver {
    pub fn gpusim_info(&self) -> Option<gpusim::Info> {
        match &self.backend {
            Backend::Gpusim(g) => g.info().ok(),
            Backend::Host => None,
        }
    }

    /// (total, free) device memory in bytes.
    pub fn mem_info(&self) -> (u64, u64) {
        if let Some(i) = self.gpusim_info() {
            return (i.bar_size, i.free_bytes);
        }
        let used = self.tables().host_used;
        (self.cfg.host_mem, self.cfg.host_mem.saturating_sub(used))
    }

    /// (domain, bus, device) of a device's PCI address.
    pub fn pci(&self, dev: CUdevice) -> (i32, i32, i32) {
        match self.gpusim_info() {
            Some(i) => (i.pci_domain as i32, i.pci_bus as i32 + dev, i.pci_device as i32),
            None => (0, 0x65 + dev, 0),
        }
    }

    pub fn device_attribute(&self, a: i32, dev: CUdevice) -> R<i32> {
        use crate::types::attr::*;
        self.check_device(dev)?;
        if a <= 0 || a >= MAX {
            return Err(err::INVALID_VALUE);
        }
        let (domain, bus, pcidev) = self.pci(dev);
        Ok(match a {
            MAX_THREADS_PER_BLOCK | MAX_BLOCK_DIM_X | MAX_BLOCK_DIM_Y => 1024,
            MAX_BLOCK_DIM_Z => 64,
            MAX_GRID_DIM_X => i32::MAX,
            MAX_GRID_DIM_Y | MAX_GRID_DIM_Z => 65535,
            MAX_SHARED_MEMORY_PER_BLOCK => 48 * 1024,
            TOTAL_CONSTANT_MEMORY => 64 * 1024,
            WARP_SIZE => 32,
            MAX_PITCH => i32::MAX,
            MAX_REGISTERS_PER_BLOCK | MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
            CLOCK_RATE => 1_755_000,
            TEXTURE_ALIGNMENT => 512,
            GPU_OVERLAP | CAN_MAP_HOST_MEMORY | CONCURRENT_KERNELS | ECC_ENABLED | UNIFIED_ADDRESSING => 1,
            MULTIPROCESSOR_COUNT => 132,
            INTEGRATED => 0,
            COMPUTE_MODE => 0,
            PCI_BUS_ID => bus,
            PCI_DEVICE_ID => pcidev,
            PCI_DOMAIN_ID => domain,
            MEMORY_CLOCK_RATE => 2_619_000,
            GLOBAL_MEMORY_BUS_WIDTH => 5120,
            L2_CACHE_SIZE => 50 << 20,
            MAX_THREADS_PER_MULTIPROCESSOR => 2048,
            ASYNC_ENGINE_COUNT => 3,
            COMPUTE_CAPABILITY_MAJOR => self.cfg.platform.cc_major(),
            COMPUTE_CAPABILITY_MINOR => 0,
            STREAM_PRIORITIES_SUPPORTED => 1,
            MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 * 1024,
            MANAGED_MEMORY | CONCURRENT_MANAGED_ACCESS => 0,
            // Coherent platforms reach pageable host memory through the CPU's page tables.
            PAGEABLE_MEMORY_ACCESS => self.cfg.platform.coherent() as i32,
            CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM => 1,
            // CUDA 13 reports the v1 capabilities as 0 (the v1 entry points need a module
            // parameter); the v2 ones below are what consumers must use.
            CAN_USE_STREAM_MEM_OPS_V1 | CAN_USE_64_BIT_STREAM_MEM_OPS_V1 | CAN_USE_STREAM_WAIT_VALUE_NOR_V1 => 0,
            CAN_USE_64_BIT_STREAM_MEM_OPS | CAN_USE_STREAM_WAIT_VALUE_NOR => 1,
            CAN_FLUSH_REMOTE_WRITES => 1,
            HOST_REGISTER_SUPPORTED | READ_ONLY_HOST_REGISTER_SUPPORTED => 1,
            PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES => self.cfg.platform.coherent() as i32,
            VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED | HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
            GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED | GPU_DIRECT_RDMA_SUPPORTED => 1,
            GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS => 1, // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST
            GPU_DIRECT_RDMA_WRITES_ORDERING => 0,
            MEMORY_POOLS_SUPPORTED => 0,
            DMA_BUF_SUPPORTED => self.dmabuf() as i32,
            _ => 0,
        })
    }
}
