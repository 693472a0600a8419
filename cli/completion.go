package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// The scripts are urfave/cli's own (autocomplete/ in its repository) for the jobbus
// binary: they ask `jobbus ... --generate-bash-completion` for the candidates.
const bashCompletion = `# jobbus bash completion: source <(jobbus completion bash)
_jobbus_bash_autocomplete() {
  if [[ "${COMP_WORDS[0]}" != "source" ]]; then
    local cur opts
    COMPREPLY=()
    cur="${COMP_WORDS[COMP_CWORD]}"
    if [[ "$cur" == "-"* ]]; then
      opts=$("${COMP_WORDS[@]:0:$COMP_CWORD}" "${cur}" --generate-bash-completion 2>/dev/null)
    else
      opts=$("${COMP_WORDS[@]:0:$COMP_CWORD}" --generate-bash-completion 2>/dev/null)
    fi
    COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
    return 0
  fi
}
complete -o bashdefault -o default -o nospace -F _jobbus_bash_autocomplete jobbus
`

const zshCompletion = `#compdef jobbus
# jobbus zsh completion: source <(jobbus completion zsh)
_jobbus_zsh_autocomplete() {
  local -a opts
  local cur
  cur=${words[-1]}
  if [[ "$cur" == "-"* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} --generate-bash-completion)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion)}")
  fi
  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
compdef _jobbus_zsh_autocomplete jobbus
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script (bash or zsh)",
		ArgsUsage: "bash|zsh",
		Description: `Examples:
   source <(jobbus completion bash)        # in ~/.bashrc
   jobbus completion zsh > "${fpath[1]}/_jobbus"`,
		Action: func(c *cli.Context) error {
			pos, err := args(c, "SHELL")
			if err != nil {
				return err
			}
			switch strings.ToLower(pos[0]) {
			case "bash":
				_, err = fmt.Fprint(c.App.Writer, bashCompletion)
			case "zsh":
				_, err = fmt.Fprint(c.App.Writer, zshCompletion)
			default:
				return usageError("completion: shell must be bash or zsh, got %q", pos[0])
			}
			return err
		},
	}
}
