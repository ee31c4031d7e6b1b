// moe-routing: the command-line tool. All logic lives in the moe_routing_cli library (cli.cpp).
#include "commands.h"

int main(int argc, char** argv) { return moe_routing::cli::main(argc, argv); }
