/* plan_print.c - --dry-run: the plan (plan.h) as text for people, or as one JSON object for
 * scripts. */
#include "plan.h"

#include <cjson/cJSON.h> /* --dry-run=json */
#include <errno.h>       /* ENOMEM */
#include <string.h>      /* strlen */

#include "sock.h" /* mgpu_sock_hostport */

static void device_line(const mgpu_plan_t *plan, const mgpu_worker_plan_t *w, char *buf, size_t len)
{
    if (w->physical < 0) {
        snprintf(buf, len, "CPU");
        return;
    }
    const mgpu_gpu_t *g = &plan->gpus.gpus[w->physical];
    snprintf(buf, len, "CUDA ordinal %d -> physical GPU %d (%s, %s)%s%s", w->ordinal, g->index,
             g->uuid, g->bus_id, g->simulated ? " [simulated]" : "",
             plan->sharing && w->local_rank >= plan->vis.count ? " [shared: --allow_gpu_sharing]"
                                                               : "");
}

void mgpu_plan_print(const mgpu_plan_t *plan, FILE *out)
{
    char list[2048];

    mgpu_devices_describe(&plan->gpus, &plan->vis, list, sizeof list);
    fprintf(out, "mgpu-launch %s plan (dry run: nothing started)\n", MGPU_VERSION);
    fprintf(out, "  host: %s  node %d of %d  local workers: %d  world size: %d\n", plan->hostname,
            plan->node_rank, plan->nnodes, plan->nproc, plan->world_size);
    fprintf(out, "  GPUs installed: %d%s\n", plan->gpus.count,
            plan->gpus.simulated ? " (simulated: MGPU_SIM_GPUS)" : "");
    fprintf(out, "  CUDA_VISIBLE_DEVICES: %s%s%s -> %d visible: %s\n", plan->vis.cvd_set ? "'" : "",
            plan->vis.cvd_set ? plan->vis.cvd : "unset (all)", plan->vis.cvd_set ? "'" : "",
            plan->vis.count, list);
    if (plan->cpu_reason[0])
        fprintf(out, "  workers run on the CPU: %s\n", plan->cpu_reason);
    if (plan->sharing)
        fprintf(
            out,
            "  --allow_gpu_sharing: %d workers share %d GPUs (local rank k -> ordinal k mod %d)\n",
            plan->nproc, plan->vis.count, plan->vis.count);
    if (plan->virtual_local_rank)
        fprintf(out, "  --virtual_local_rank: LOCAL_RANK=0 in every worker, which sees its own GPU "
                     "alone (CUDA_VISIBLE_DEVICES)\n");
    if (plan->derived[0])
        fprintf(out, "  from the environment: %s\n", plan->derived);
    if (plan->nnodes > 1)
        fprintf(out, "  ranks assume %d workers on every node; the rendezvous decides them\n",
                plan->nproc);
    if (plan->python[0])
        fprintf(out, "  python: %s (PYTHON_EXEC chooses another)\n", plan->python);
    char hp[300];
    if (plan->nnodes > 1)
        /* Where the nodes meet, and the port rule a firewall must follow. */
        fprintf(out,
                "  master: %s (the launchers' store)  run id: %s  max restarts: %d\n"
                "  ports: the store listens on %d; MASTER_PORT is that port + 1 (%d), on the node "
                "of global rank 0: a firewall must let both through\n",
                mgpu_sock_hostport(hp, sizeof hp, plan->master_addr, plan->rdzv_port), plan->run_id,
                plan->max_restarts, plan->rdzv_port, plan->master_port);
    else
        fprintf(out, "  master: %s%s  run id: %s  max restarts: %d\n",
                mgpu_sock_hostport(hp, sizeof hp, plan->master_addr, plan->master_port),
                plan->port_is_free_pick ? " (a free port)" : "", plan->run_id, plan->max_restarts);
    for (int i = 0; i < 2; i++) {
        const mgpu_line_filters_t *f = &plan->output.dup[i];
        const char *p = f->buf;
        if (f->n == 0)
            continue;
        fprintf(out, "  %s lines shown that contain", i == 0 ? "stdout" : "stderr");
        for (int j = 0; j < f->n; j++, p += strlen(p) + 1)
            fprintf(out, "%s '%s'", j == 0 ? "" : " or", p);
        if (plan->output.log_dir[0])
            fprintf(out, " are also copied to %s/%s_<8 chars>/attempt_<n>/filtered_%s.log\n",
                    plan->output.log_dir, plan->run_id, i == 0 ? "stdout" : "stderr");
        else
            fprintf(out,
                    " are also copied to attempt_<n>/filtered_%s.log in a temporary folder, "
                    "kept (no --log_dir)\n",
                    i == 0 ? "stdout" : "stderr");
    }
    for (int k = 0; k < plan->nproc; k++) {
        const mgpu_worker_plan_t *w = &plan->workers[k];
        char dev[512];
        device_line(plan, w, dev, sizeof dev);
        fprintf(out, "worker rank %d (local rank %d): %s\n", w->rank, w->local_rank, dev);
        if (plan->numa_mode != MGPU_NUMA_OFF && w->bound) {
            char cpus[1024];
            mgpu_cpulist_format(&w->cpus, cpus, sizeof cpus);
            fprintf(out, "  cpus: %s (NUMA node %d, --numa_binding=%s)\n", cpus, w->numa_node,
                    mgpu_numa_mode_name(plan->numa_mode));
        } else if (plan->numa_mode != MGPU_NUMA_OFF) {
            fprintf(out, "  cpus: not bound (--numa_binding=%s: %s)\n",
                    mgpu_numa_mode_name(plan->numa_mode), w->numa_why);
        }
        fprintf(out, "  env:");
        for (int i = 0; i < w->nvars; i++)
            fprintf(out, " %s", mgpu_plan_var_at(plan, k, i, NULL));
        fprintf(out, "\n  command:");
        for (int i = 0; w->argv[i] != NULL; i++)
            fprintf(out, " %s", w->argv[i]);
        fprintf(out, "\n");
    }
}

int mgpu_plan_print_json(const mgpu_plan_t *plan, FILE *out)
{
    cJSON *root = cJSON_CreateObject(), *workers, *gpus;
    char *text;

    if (root == NULL)
        return -ENOMEM;
    cJSON_AddStringToObject(root, "version", MGPU_VERSION);
    cJSON_AddStringToObject(root, "host", plan->hostname);
    cJSON_AddNumberToObject(root, "node_rank", plan->node_rank);
    cJSON_AddNumberToObject(root, "nnodes", plan->nnodes);
    cJSON_AddNumberToObject(root, "nproc_per_node", plan->nproc);
    cJSON_AddNumberToObject(root, "world_size", plan->world_size);
    cJSON_AddStringToObject(root, "master_addr", plan->master_addr);
    cJSON_AddNumberToObject(root, "master_port", plan->master_port);
    if (plan->nnodes > 1)
        cJSON_AddNumberToObject(root, "store_port", plan->rdzv_port);
    cJSON_AddStringToObject(root, "run_id", plan->run_id);
    cJSON_AddStringToObject(root, "derived", plan->derived);
    if (plan->python[0])
        cJSON_AddStringToObject(root, "python", plan->python);
    else
        cJSON_AddNullToObject(root, "python");
    cJSON_AddBoolToObject(root, "simulated", plan->gpus.simulated);
    if (plan->vis.cvd_set)
        cJSON_AddStringToObject(root, "cuda_visible_devices", plan->vis.cvd);
    else
        cJSON_AddNullToObject(root, "cuda_visible_devices");
    cJSON_AddNumberToObject(root, "gpus_installed", plan->gpus.count);
    cJSON_AddNumberToObject(root, "gpus_visible", plan->vis.count);
    cJSON_AddBoolToObject(root, "gpu_sharing", plan->sharing);
    if (plan->cpu_reason[0])
        cJSON_AddStringToObject(root, "cpu_reason", plan->cpu_reason);
    gpus = cJSON_AddArrayToObject(root, "visible");
    for (int k = 0; k < plan->vis.count; k++) {
        const mgpu_gpu_t *g = &plan->gpus.gpus[plan->vis.physical[k]];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "ordinal", k);
        cJSON_AddNumberToObject(o, "physical", g->index);
        cJSON_AddStringToObject(o, "uuid", g->uuid);
        cJSON_AddStringToObject(o, "bus_id", g->bus_id);
        cJSON_AddItemToArray(gpus, o);
    }
    workers = cJSON_AddArrayToObject(root, "workers");
    for (int k = 0; k < plan->nproc; k++) {
        const mgpu_worker_plan_t *w = &plan->workers[k];
        cJSON *o = cJSON_CreateObject(), *env, *argv;
        cJSON_AddNumberToObject(o, "rank", w->rank);
        cJSON_AddNumberToObject(o, "local_rank", w->local_rank);
        cJSON_AddStringToObject(o, "device", w->physical >= 0 ? "gpu" : "cpu");
        if (w->physical >= 0) {
            const mgpu_gpu_t *g = &plan->gpus.gpus[w->physical];
            cJSON_AddNumberToObject(o, "cuda_ordinal", w->ordinal);
            cJSON_AddNumberToObject(o, "physical_gpu", g->index);
            cJSON_AddStringToObject(o, "gpu_uuid", g->uuid);
            cJSON_AddStringToObject(o, "gpu_bus_id", g->bus_id);
            cJSON_AddBoolToObject(o, "simulated", g->simulated);
        } else {
            cJSON_AddNullToObject(o, "cuda_ordinal");
            cJSON_AddNullToObject(o, "physical_gpu");
        }
        if (plan->numa_mode != MGPU_NUMA_OFF) {
            char list[1024];
            cJSON *numa = cJSON_AddObjectToObject(o, "numa_binding");
            cJSON_AddStringToObject(numa, "mode", mgpu_numa_mode_name(plan->numa_mode));
            if (w->numa_node >= 0)
                cJSON_AddNumberToObject(numa, "node", w->numa_node);
            else
                cJSON_AddNullToObject(numa, "node");
            mgpu_cpulist_format(&w->cpus, list, sizeof list);
            if (w->bound)
                cJSON_AddStringToObject(numa, "cpus", list);
            else
                cJSON_AddNullToObject(numa, "cpus");
            if (!w->bound)
                cJSON_AddStringToObject(numa, "unbound", w->numa_why);
        }
        env = cJSON_AddObjectToObject(o, "env");
        for (int i = 0; i < w->nvars; i++) {
            size_t klen;
            const char *v = mgpu_plan_var_at(plan, k, i, &klen);
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)klen, v);
            cJSON_AddStringToObject(env, key, v + klen + 1);
        }
        argv = cJSON_AddArrayToObject(o, "argv");
        for (int i = 0; w->argv[i] != NULL; i++)
            cJSON_AddItemToArray(argv, cJSON_CreateString(w->argv[i]));
        cJSON_AddItemToArray(workers, o);
    }
    text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL)
        return -ENOMEM;
    fprintf(out, "%s\n", text);
    cJSON_free(text);
    return 0;
}
