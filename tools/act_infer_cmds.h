/* act_infer_cmds.h - the subcommands of act-infer, one file each (tools/infer_*.c).
 * Each takes the arguments after the subcommand name and returns the process exit code. */
#ifndef ACT_INFER_CMDS_H
#define ACT_INFER_CMDS_H
int act_cmd_info(int argc, char **argv);        /* infer_info.c */
int act_cmd_predict(int argc, char **argv);     /* infer_predict.c */
int act_cmd_eval(int argc, char **argv);        /* infer_eval.c */
int act_cmd_eval_merge(int argc, char **argv);  /* infer_eval.c */
int act_cmd_bench(int argc, char **argv);       /* infer_bench.c */
#endif
