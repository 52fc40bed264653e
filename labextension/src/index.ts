import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { CheckpointsModel } from './model';
import { CheckpointsPanel } from './sidebar';

const PLUGIN_ID = 'nbckpt:plugin';

/** Command ids. */
export const CommandIDs = {
  open: 'nbckpt:open-sidebar',
  refresh: 'nbckpt:refresh'
} as const;

const checkpointIcon = new LabIcon({
  name: 'nbckpt:checkpoint',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<path class="jp-icon3" fill="#616161" d="M5 3h11l3 3v15H5zm2 2v5h9V5zm2 1h2v3H9zm-2' +
    ' 7v6h10v-6z"/></svg>'
});

/** The status-bar item: how many saves are in flight in the sidebar's root. */
class SavingStatus extends Widget {
  constructor(model: CheckpointsModel, onClick: () => void) {
    super();
    this.addClass('nbckpt-statusbar');
    this.node.title = 'nbckpt saves in flight: open the Checkpoints sidebar';
    this.node.addEventListener('click', onClick);
    model.changed.connect(() => {
      const n = model.inFlight.length;
      this.node.textContent = n ? `Checkpoint: ${n} saving` : '';
    });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'A Checkpoints sidebar over the nbckpt server routes: steps, states and per-host save timelines.',
  autoStart: true,
  optional: [
    ICommandPalette,
    ISettingRegistry,
    IStatusBar,
    ILayoutRestorer,
    IDefaultFileBrowser
  ],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    restorer: ILayoutRestorer | null,
    fileBrowser: IDefaultFileBrowser | null
  ) => {
    const model = new CheckpointsModel();
    let defaultRoot = '';
    const panel = new CheckpointsPanel(model);
    panel.title.icon = checkpointIcon;
    panel.title.caption = 'Checkpoints';
    app.shell.add(panel, 'left', { rank: 850 });
    restorer?.add(panel, panel.id);

    // The first time the sidebar shows, open the configured root, or else the
    // directory the file browser is in (where the notebook and its checkpoints are).
    const openDefault = (): void => {
      if (model.root === null) {
        void panel.openRoot(defaultRoot || fileBrowser?.model.path || '');
      }
    };
    const open = (): void => {
      app.shell.activateById(panel.id);
      openDefault();
    };
    panel.whenShown = openDefault;
    if (panel.isVisible) {
      openDefault();
    }

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open Checkpoints Sidebar',
      caption: 'Show the nbckpt checkpoints and save timelines',
      icon: checkpointIcon,
      execute: open
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Checkpoints',
      execute: () => model.refresh()
    });
    palette?.addItem({ command: CommandIDs.open, category: 'Checkpoints' });
    palette?.addItem({ command: CommandIDs.refresh, category: 'Checkpoints' });

    if (statusBar) {
      statusBar.registerStatusItem('nbckpt:saving', {
        item: new SavingStatus(model, open),
        align: 'left',
        rank: 100,
        isActive: () => model.inFlight.length > 0,
        activeStateChanged: model.changed
      });
    }

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings): void => {
        defaultRoot = String(settings.get('defaultRoot').composite ?? '');
        model.refreshSeconds = Number(settings.get('refreshSeconds').composite);
        model.idleRefreshSeconds = Number(
          settings.get('idleRefreshSeconds').composite
        );
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.error('nbckpt: cannot load settings', reason);
        });
    }
  }
};

export default plugin;
