/* SPDX-License-Identifier: MIT */
/*
 * Shared code of the libnvm tools (nvm-identify, nvm-read-blocks, nvm-bench): opening a
 * controller either through the helper module (/dev/libnvmN, as upstream's nvm-identify) or
 * module-free through sysfs BAR0 + /proc/self/pagemap (as upstream's nvm-identify-userspace),
 * host DMA windows for either, the admin queue, I/O queue pairs and a clock. Written against the
 * installed nvm_*.h headers only, as any libnvm consumer.
 */
#ifndef NVMTOOL_H
#define NVMTOOL_H

#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_admin.h>
#include <nvm_rpc.h>
#include <nvm_cmd.h>
#include <nvm_queue.h>
#include <nvm_util.h>
#include <nvm_error.h>
#include <stddef.h>
#include <stdint.h>

/* A controller opened by a tool. */
struct tool_ctrl {
    nvm_ctrl_t* ctrl;
    nvm_aq_ref aq;
    int module;           /* 1: /dev/libnvmN; 0: sysfs resource0 + pagemap */
    char bdf[32];         /* module-free: the PCI address */
    volatile void* bar;   /* module-free: our BAR0 mapping */
    size_t bar_size;
    int pagemap;          /* module-free: /proc/self/pagemap */
    void* adm_va;         /* 3 pages: ACQ, ASQ, identify buffer */
    nvm_dma_t* adm;
    size_t ps;            /* controller (= host) page size */
};

/* Host memory visible to the controller. */
struct tool_buf {
    void* va;
    size_t size;
    nvm_dma_t* win;
};

/* One I/O queue pair in one host buffer: page 0 CQ, page 1 SQ, pages 2.. one PRP list page per
 * SQ slot (NULL list pages when prp_pages is 0). */
struct tool_qp {
    nvm_queue_t cq, sq;
    struct tool_buf mem;
    int prp_lists;
};

/* "/dev/..." or any character device: the module path; "[dddd:]bb:dd.f" or a path ending in
 * resource0: module-free. Returns 0 or an errno, with a message on stderr. */
int tool_open(struct tool_ctrl* t, const char* spec);
/* Resets the controller and creates the admin queue pair (3-page window, page 2 for identify). */
int tool_admin(struct tool_ctrl* t);
/* Page-aligned, zeroed host memory of size bytes (rounded up to pages) with a DMA window. */
int tool_buf_new(struct tool_ctrl* t, struct tool_buf* b, size_t size);
void tool_buf_free(struct tool_buf* b);
/* Creates CQ and SQ `id` (SQ size min(MQES+1, page/64)); prp_lists adds one list page per slot. */
int tool_qp_create(struct tool_ctrl* t, struct tool_qp* qp, uint16_t id, int prp_lists);
/* Deletes SQ then CQ and frees the memory. */
int tool_qp_delete(struct tool_ctrl* t, struct tool_qp* qp);
void tool_close(struct tool_ctrl* t);

/* Identify controller / namespace into the admin window's page 2. */
int tool_ctrl_info(struct tool_ctrl* t, struct nvm_ctrl_info* info);
int tool_ns_info(struct tool_ctrl* t, uint32_t ns_id, struct nvm_ns_info* ns);

/* upstream's nvm-identify report blocks (stdout). */
void tool_print_ctrl_info(const struct nvm_ctrl_info* info, uint16_t n_cqs, uint16_t n_sqs);
void tool_print_ns_info(const struct nvm_ns_info* ns);

/* Monotonic nanoseconds. */
uint64_t tool_now_ns(void);
/* Parses an unsigned number (decimal, 0x hex); 0 on success, EINVAL otherwise. */
int tool_parse_u64(const char* s, uint64_t* v);
/* Checks that the string is a PCI address "[dddd:]bb:dd.f"; writes the 4-domain form into out. */
int tool_parse_bdf(const char* s, char* out, size_t len);

#endif
