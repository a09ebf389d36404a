// SPDX-License-Identifier: MIT
/*
 * fork_locks - what a fork child gets from libgdrapi while another thread of the parent is inside
 * the library. The child must never deadlock on a lock some other thread held at fork time: its
 * calls on the parent's gdr_t return (any documented result; with gdrdrv the kernel answers
 * EACCES), and it can open, use and close an instance of its own.
 *
 *   fork_locks [--children=N]    exit 0: all children fine; 10: some deadlocked (and nothing
 *                                else went wrong); 1: another failure. Prints the counts.
 *
 * Run by compat-tests/fuzz/run.sh on the dma-buf backend over cudasim. A child that does not
 * finish within 2 s is killed by its alarm and counted as deadlocked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gdrapi.h>

static gdr_t parent_g;
static volatile int stop;

/* Keeps the library's registries busy: opens, closes, lookups of (bogus) handles. */
static void *hammer(void *arg)
{
	(void)arg;
	while (!stop) {
		gdr_mh_t mh = { 12345 };
		gdr_info_t info;
		gdr_t g2 = gdr_open();

		gdr_get_info_v2(parent_g, mh, &info);
		if (g2)
			gdr_close(g2);
	}
	return NULL;
}

/* In the child: only the calls must return; results are checked against the documented set. */
static int child(void)
{
	int v = -1, r;
	gdr_t own;

	alarm(2);
	r = gdr_get_attribute(parent_g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v);
	if (r != 0 && r != EACCES && r != EINVAL)
		return 3;
	own = gdr_open();
	if (!own)
		return 4;
	if (gdr_close(own) != 0)
		return 5;
	return 0;
}

int main(int argc, char **argv)
{
	int i, n = 300, hung = 0, bad = 0;
	pthread_t t;

	if (argc > 1) {
		char *end;
		long v;

		errno = 0;
		v = strncmp(argv[1], "--children=", 11) ? -1 : strtol(argv[1] + 11, &end, 10);
		if (v < 1 || v > 100000 || errno || argv[1][11] == '\0' || *end != '\0' || argc > 2) {
			fprintf(stderr, "usage: fork_locks [--children=N] (1 <= N <= 100000; default 300)\n");
			return 2;
		}
		n = (int)v;
	}
	parent_g = gdr_open();
	if (!parent_g) {
		fprintf(stderr, "fork_locks: gdr_open failed\n");
		return 2;
	}
	if (pthread_create(&t, NULL, hammer, NULL)) {
		fprintf(stderr, "fork_locks: pthread_create failed\n");
		return 2;
	}
	for (i = 0; i < n; i++) {
		int st;
		pid_t p = fork();

		if (p == 0)
			_exit(child());
		if (p < 0 || waitpid(p, &st, 0) != p) {
			bad++;
			continue;
		}
		if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
			hung++;
		else if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
	}
	stop = 1;
	pthread_join(t, NULL);
	gdr_close(parent_g);
	printf("fork_locks: %d children, %d deadlocked, %d failed otherwise\n", n, hung, bad);
	return bad ? 1 : hung ? 10 : 0;
}
