/*
 * libnvm-compatible public types (gpudirect-rs). Layouts are ABI: every size and offset here
 * matches libnvm (ssd-gpu-dma) on x86-64 LP64; compat-tests/libnvm/layout.c checks them.
 */
#ifndef __NVM_TYPES_H__
#define __NVM_TYPES_H__

#include <stddef.h>
#include <stdint.h>

/* nvcc supplies __align__; for every other compiler it is empty here and removed again below. */
#ifndef __CUDACC__
#define __align__(x)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A controller handle. The library allocates it; consumers read the fields directly. */
typedef struct
{
    size_t                  page_size;      /* controller memory page size (= host page size) */
    uint8_t                 dstrd;          /* CAP.DSTRD as encoded by the controller */
    uint64_t                timeout;        /* CAP.TO in milliseconds */
    uint16_t                max_entries;    /* CAP.MQES + 1 */
    size_t                  mm_size;        /* size of the BAR0 mapping */
    volatile void*          mm_ptr;         /* BAR0 mapping */
} nvm_ctrl_t;

/* Opaque reference to an admin queue pair (local) or an RPC binding. */
typedef struct nvm_admin_reference* nvm_aq_ref;

/*
 * A DMA window: a region of memory as the controller sees it, one bus address per controller
 * page. ioaddrs starts at offset 24 (inside the 32-byte aligned size). Only the library creates
 * these.
 */
typedef struct __align__(32)
{
    void*                   vaddr;          /* start of the region as given by the caller */
    size_t                  page_size;      /* controller page size */
    size_t                  n_ioaddrs;      /* number of controller pages */
    uint64_t                ioaddrs[];      /* bus address of each page */
} __attribute__((aligned (32))) nvm_dma_t;

/* One submission or completion queue, as the host (or a GPU thread) drives it. */
typedef struct __align__(64)
{
    uint16_t                no;             /* queue identifier */
    uint16_t                max_entries;    /* entries in the ring */
    uint16_t                entry_size;     /* 64 (SQ) or 16 (CQ) */
    uint32_t                head;
    uint32_t                tail;
    int16_t                 phase;          /* expected phase tag (CQ), wrap parity (SQ) */
    uint32_t                last;           /* last value written to the doorbell */
    volatile uint32_t*      db;             /* doorbell; NULL once the queue is deleted */
    volatile void*          vaddr;          /* ring memory */
    uint64_t                ioaddr;         /* bus address of the ring */
} __attribute__((aligned (64))) nvm_queue_t;

/* Completion queue entry. */
typedef struct __align__(16)
{
    uint32_t                dword[4];
} __attribute__((aligned (16))) nvm_cpl_t;

/* Submission queue entry. */
typedef struct __align__(64)
{
    uint32_t                dword[16];
} __attribute__((aligned (64))) nvm_cmd_t;

/* Decoded Identify Controller data plus register facts. */
struct nvm_ctrl_info
{
    uint32_t                nvme_version;   /* VS register */
    size_t                  page_size;
    size_t                  db_stride;      /* 1 << DSTRD */
    uint64_t                timeout;        /* milliseconds */
    int                     contiguous;     /* CAP.CQR */
    uint16_t                max_entries;    /* CAP.MQES + 1 */
    uint8_t                 pci_vendor[4];  /* VID, SSVID (little-endian) */
    char                    serial_no[20];  /* space padded, not NUL terminated */
    char                    model_no[40];
    char                    firmware[8];
    size_t                  max_data_size;  /* bytes per command (MDTS) */
    size_t                  max_data_pages;
    size_t                  cq_entry_size;
    size_t                  sq_entry_size;
    size_t                  max_out_cmds;   /* MAXCMD */
    size_t                  max_n_ns;       /* NN */
};

/* Decoded Identify Namespace data. */
struct nvm_ns_info
{
    uint32_t                ns_id;
    uint64_t                size;           /* NSZE, blocks */
    uint64_t                capacity;       /* NCAP, blocks */
    uint64_t                utilization;    /* NUSE, blocks */
    size_t                  lba_data_size;  /* bytes per block */
    size_t                  metadata_size;  /* bytes of metadata per block */
};

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
#undef __align__
#endif

#endif /* __NVM_TYPES_H__ */
